cd /work/main
S="sparse_attention.sol.backend=reference"
for case in "L_sol2_125:$S sparse_attention.sol.beta=1.25" "L_solboth_125:$S sparse_attention.sol.beta=1.25 sparse_attention.sol.stages=both" "L_sol2_3:$S sparse_attention.sol.beta=3.0" "L_sol2_125_tiles:$S sparse_attention.sol.beta=1.25 sparse_attention.sol.token_order=tiles"; do
  name=${case%%:*}; knobs=${case#*:}
  /usr/bin/time -v python -m vidtune.cli evaluate model=ltx2-mini request.height=512 request.width=768 request.frames=33 results_dir=/tmp/mq/results name=mqL eval.repeats=1 eval.warmup=0 compile_cache=false --json --knobs $knobs > /tmp/mq/$name.json 2> /tmp/mq/$name.log
done
