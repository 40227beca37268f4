#!/usr/bin/env bash
# One prepared run on a machine with a CUDA GPU: calibrate, fidelity, the cuda-marked tests.
# Everything goes to ${OUT:-gpu-run}/ (calibrated.json, measurements.json, fidelity.txt,
# cuda-tests.txt and the logs); each step runs even if the one before failed.
set -u
out=${OUT:-gpu-run}
mkdir -p "$out"
# what the machine is (the first thing to read when a step below fails)
{ nvidia-smi; python -c "import sys, torch; print(sys.version); print(torch.__version__, \
torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name() \
if torch.cuda.is_available() else '')"; } > "$out/env.txt" 2>&1
python -m memcpy_doctor calibrate -o "$out/calibrated.json" \
    --measurements "$out/measurements.json" 2> "$out/calibrate.log"
echo "calibrate exit $?" >> "$out/calibrate.log"
python benchmarks/fidelity.py --device-profile "$out/calibrated.json" \
    > "$out/fidelity.txt" 2> "$out/fidelity.log"
echo "fidelity exit $?" >> "$out/fidelity.txt"
python -m pytest -q -p no:cacheprovider -m cuda tests > "$out/cuda-tests.txt" 2>&1
echo "cuda tests exit $?" >> "$out/cuda-tests.txt"
