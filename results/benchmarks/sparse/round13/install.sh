# Sourced by run.sh and run_b.sh: unpack the two carried chunks (.dw5/0 copied to /tmp/vt-chunks/0 by an
# earlier call, .dw5/1 carried with this one) once per machine, install vidtune, set PYTHONPATH.
if [ -d .dw5/1 ]; then mkdir -p /tmp/vt-chunks && cp .dw5/1/chunk /tmp/vt-chunks/1; fi
if [ ! -d /tmp/cdsl-site/nvidia_cutlass_dsl ]; then
  cat /tmp/vt-chunks/0 /tmp/vt-chunks/1 > /tmp/pk.tar && mkdir -p /tmp/pk && tar -xf /tmp/pk.tar -C /tmp/pk
  mkdir -p /tmp/cdsl-site && xz -dc /tmp/pk/cdsl.tar.xz | tar -x -C /tmp/cdsl-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/pk/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/vt .
export PYTHONPATH=/tmp/vt:/tmp/site:/tmp/cdsl-site PYTHONUNBUFFERED=1
