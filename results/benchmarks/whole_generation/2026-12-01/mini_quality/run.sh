cd /work/main
E="kernel_choice.fp8_linear.layers=all kernel_choice.fp8_linear.quantiser=traced kernel_choice.compile.mode=default kernel_choice.compile.dynamic=false kernel_choice.vae_decode.compile=default kernel_choice.vae_decode.channels_last=true kernel_choice.vae_decode.cudnn_benchmark=true"
S="sparse_attention.sol.beta=1.25 sparse_attention.sol.backend=reference"
for case in "exact:$E" "sol2:$E $S" "solboth:$E $S sparse_attention.sol.stages=both" "vae_only:kernel_choice.vae_decode.compile=default kernel_choice.vae_decode.channels_last=true kernel_choice.vae_decode.cudnn_benchmark=true" "solboth_only:$S sparse_attention.sol.stages=both"; do
  name=${case%%:*}; knobs=${case#*:}
  /usr/bin/time -v python -m vidtune.cli evaluate model=ltx2-mini results_dir=/tmp/mq/results name=mq eval.repeats=1 --json --knobs $knobs > /tmp/mq/$name.json 2> /tmp/mq/$name.log
done
