# Sourced by the tests that start a real torchrun (torchrun.sh, multi_node_netns.sh).
# Sets `python` to a python3 that has torch (Debian's python3-torch), or to "" when none has.
# Sets `torchrun_output`, the output flags every torchrun call passes: Debian's torchrun 1.13
# under Python 3.11 fails on the default --redirects/--tee of 0 (Std.from_str finds no member for
# 0, since Python 3.11 no longer iterates zero-valued IntFlag members); 1 (stdout) works: each
# worker's stdout reaches the console prefixed with "[default<local rank>]:".
python=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch.distributed.run' 2>/dev/null; then
    python=$p
    break
  fi
done
torchrun_output=(--redirects 1 --tee 1)
