#!/usr/bin/env bash
# Check provisioner's GPU support on a REAL NVIDIA GPU machine (the lab only simulates GPUs).
#
#   scripts/gpu_check.sh                 # on the GPU machine, from the repository root
#   scripts/gpu_check.sh -i INVENTORY    # also doctor --gpu-deep, up and submit on that cluster
#
# Needs: the NVIDIA driver, Docker with the NVIDIA Container Toolkit, `make install` done, and
# the CUDA image built and its pin written (`.venv/bin/provisioner image build --cuda`; set
# CUDA_PIN to use another pin file). Steps, each printed with PASS or FAIL:
#   1. facts: this machine's facts.sh output parsed as the doctor parses it: GPUs, driver,
#      toolkit, the way Docker hands GPUs over, and the doctor's GPU findings for this node;
#   2. image: a container of the CUDA image, with the GPU options `up` builds, sees the GPUs
#      (nvidia-smi -L inside, and torch.cuda);
#   3. training: a one-node Ray in that container (--num-gpus as `up` gives it) runs
#      playbooks/ppo_cartpole.py for a few thousand steps with a GPU learner; summary.json
#      must say it trained on cuda.
# With -i INVENTORY (SSH access to the nodes as for any provisioner command):
#   4. cluster: `doctor --gpu-deep`, `up`, and a short `submit` with --num-gpus-per-learner 1.
# Writes everything to gpu-check-out/ (or $OUT): facts.txt, findings.json, inside.txt,
# training.log, summary.json, and a one-line verdict per step in verdict.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PROV=${PROV:-.venv/bin/provisioner}
CUDA_PIN=${CUDA_PIN:-images/image-cuda.lock.json}
OUT=${OUT:-gpu-check-out}
INVENTORY=
[ "${1:-}" = "-i" ] && INVENTORY=${2:?-i needs an inventory file}
mkdir -p "$OUT"
: >"$OUT/verdict.txt"
failed=0
verdict() {  # verdict STEP PASS|FAIL TEXT
  echo "$1: $2 $3" | tee -a "$OUT/verdict.txt"
  [ "$2" = PASS ] || failed=1
}

for need in nvidia-smi docker; do
  command -v "$need" >/dev/null || { echo "missing: $need (this script is for a GPU machine)"; exit 2; }
done
[ -x "$PY" ] || { echo "missing: $PY (run make install)"; exit 2; }
nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"

# --- 1. facts ---------------------------------------------------------------------------
bash provisioner/doctor/facts.sh 127.0.0.1 127.0.0.1 "" "" 0 <provisioner/doctor/facts.sh >"$OUT/facts.txt" 2>"$OUT/facts.err"
"$PY" - "$OUT" "$CUDA_PIN" <<'EOF' && verdict facts PASS "$(cat "$OUT/facts-line.txt")" || verdict facts FAIL "$(cat "$OUT/facts-line.txt" 2>/dev/null)"
import json, sys, pathlib, subprocess
from provisioner.checks.facts import parse_facts
from provisioner.checks.gpu_checks import check_gpus
from provisioner.checks.intent import PinFacts, Plan
from provisioner.gpu.assignment import plan_gpus
from provisioner.runtime.docker.gpu import gpu_methods as docker_gpu_methods
from provisioner.runtime.docker.gpu import gpu_options as docker_gpu_options
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.runtime.docker.runtime import CAPS, DockerRuntime
out, pin_path = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
facts = parse_facts("this-node", (out / "facts.txt").read_text())
g = facts.gpu
smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
node = Node("this-node", "127.0.0.1", "head", SSHSettings(user="me"))
pin = None
if pin_path.exists():
    data = json.loads(pin_path.read_text())
    pin = PinFacts(data["image_id"], data["versions"]["python"], data["versions"]["ray"], cuda=str(data.get("extra", {}).get("cuda") or ""))
findings = check_gpus(node, facts, Plan(ports=RayPorts(), head="this-node", pin=pin, caps=CAPS))
(out / "findings.json").write_text(json.dumps([f.to_dict() for f in findings], indent=1))
for f in findings:
    print(f"  {f.severity:7} {f.check:13} {f.message}" + (f"\n          fix: {f.fix}" if f.fix else ""))
plan = plan_gpus(node, g, DockerRuntime.gpu_methods)
(out / "plan.json").write_text(json.dumps({"options": docker_gpu_options(plan) if plan else [], "count": plan.count if plan else 0, "accelerator_type": plan.accelerator_type if plan else None}))
listed = len([ln for ln in smi.splitlines() if ln.startswith("GPU ")])
line = f"{len(g.gpus)} GPU(s) parsed (nvidia-smi -L lists {listed}), driver {g.driver_version}, toolkit {g.toolkit_version or '?'}, ways in: {', '.join(docker_gpu_methods(g)) or 'none'}"
(out / "facts-line.txt").write_text(line)
ok = g.driver_ok and len(g.gpus) == listed and plan is not None and not [f for f in findings if f.severity == "error"]
sys.exit(0 if ok else 1)
EOF

# --- 2. a GPU visible inside the CUDA image ----------------------------------------------
IMAGE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["image_id"])' "$CUDA_PIN" 2>/dev/null)
OPTIONS=$("$PY" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["options"]))' "$OUT/plan.json" 2>/dev/null)
COUNT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["count"])' "$OUT/plan.json" 2>/dev/null || echo 0)
if [ -z "$IMAGE" ] || [ -z "$OPTIONS" ]; then
  verdict image FAIL "no CUDA pin ($CUDA_PIN) or no GPU options from step 1"
else
  eval "docker run --rm -i $OPTIONS $IMAGE python3 -" <<'EOF' >"$OUT/inside.txt" 2>&1
import subprocess, torch
print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
x = torch.ones(1024, 1024, device="cuda")
print("matmul on", torch.cuda.get_device_name(0), float((x @ x).sum()))
EOF
  if grep -q "available True devices $COUNT" "$OUT/inside.txt" && grep -q "^matmul on" "$OUT/inside.txt"; then
    verdict image PASS "$(grep '^torch' "$OUT/inside.txt")"
  else
    verdict image FAIL "$(tail -n 3 "$OUT/inside.txt" | tr '\n' ' ')"
  fi
fi

# --- 3. a short PPO run with a GPU learner, Ray in the CUDA image --------------------------
if [ -n "$IMAGE" ] && [ -n "$OPTIONS" ]; then
  eval "docker run --rm $OPTIONS --shm-size=2g -v \"$PWD/playbooks:/playbooks:ro\" -v \"$PWD/$OUT:/out\" \
    -e RAY_USAGE_STATS_ENABLED=0 $IMAGE bash -c 'ray start --head --num-gpus=$COUNT --disable-usage-stats >/dev/null && \
    cd /playbooks && RAY_ADDRESS=auto python3 ppo_cartpole.py --max-env-steps 4000 --env-runners 1 \
    --num-gpus-per-learner 1 --num-learners 1 --results /out/run; rc=\$?; ray stop --force >/dev/null; exit \$rc'" \
    >"$OUT/training.log" 2>&1
  rc=$?
  cp "$OUT/run/summary.json" "$OUT/summary.json" 2>/dev/null
  if [ $rc = 0 ] && grep -q '"cuda' "$OUT/summary.json" 2>/dev/null; then
    verdict training PASS "$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["trained_on"], s["env_steps"], "steps")' "$OUT/summary.json")"
  else
    verdict training FAIL "exit $rc; $(tail -n 3 "$OUT/training.log" | tr '\n' ' ')"
  fi
else
  verdict training FAIL "skipped: no image or GPU options"
fi

# --- 4. the whole cluster path, with an inventory ----------------------------------------
if [ -n "$INVENTORY" ]; then
  "$PROV" doctor -i "$INVENTORY" --gpu-deep --json >"$OUT/doctor.json"
  [ $? = 0 ] && verdict doctor PASS "no errors with --gpu-deep" || verdict doctor FAIL "see $OUT/doctor.json"
  if "$PROV" up -i "$INVENTORY" --json >"$OUT/up.json"; then
    verdict up PASS "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("gpus", {n: (p["method"], len(p["uuids"])) for n, p in d["gpus"].items()}, "totals", d["totals"])' "$OUT/up.json")"
    if "$PROV" submit -i "$INVENTORY" playbooks/ppo_cartpole.py -- --max-env-steps 4000 --num-gpus-per-learner 1 >"$OUT/submit.log" 2>&1 \
      && grep -q "learners: cuda" "$OUT/submit.log"; then
      verdict submit PASS "$(grep '^learners:' "$OUT/submit.log" | head -n 1)"
    else
      verdict submit FAIL "see $OUT/submit.log"
    fi
    "$PROV" down -i "$INVENTORY" --no-logs >/dev/null 2>&1
  else
    verdict up FAIL "see $OUT/up.json"
  fi
fi
echo "verdicts in $OUT/verdict.txt"
exit $failed
