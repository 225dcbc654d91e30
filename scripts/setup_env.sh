#!/usr/bin/env bash
# Create or update the course's virtual environment (.venv). Idempotent: it re-installs only when
# the requirements, pyproject.toml or the chosen torch build changed.
#
#   TORCH   the torch requirement to install (default: torch==2.13.0, a CPU build).
#           GPU users: TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
#   PYTHON  the interpreter that creates the venv (default: python3.11, else python3)
#   VENV    where the environment lives (default: .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH=${TORCH:-torch==2.13.0}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
stamp="$VENV/.zero-lab-installed"
want=$( (echo "$TORCH"; cat requirements.txt requirements-dev.txt requirements-peers.txt pyproject.toml) | sha256sum | cut -d' ' -f1)

# The browser test (tests/test_browser.py) drives Debian's Chromium; install it where we can.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "Installing Chromium for the browser test (apt-get install chromium) ..."
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null \
      || echo "warning: could not install chromium; tests/test_browser.py will fail" >&2
  else
    echo "note: tests/test_browser.py needs Chromium: sudo apt-get install chromium" >&2
  fi
fi

# DeepSpeed on CPU compiles its shared-memory collective op (C++, one to three minutes) the first time an
# engine starts. Build it here, once, so that no test or notebook pays for it inside its time limit; a build
# killed half-way leaves a lock that would make every later load of that op wait forever, so any op's lock
# left from before this run (over 2 minutes old) goes first. The tests use torch's AdamW ("torch_adam": true),
# so DeepSpeed's other CPU ops (FusedAdam, CPU Adam: several minutes each to build) are never needed.
warm_deepspeed() {  # a few seconds when the op is built already
  local ext="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
  find "$ext" -mindepth 2 -maxdepth 3 -name lock -mmin +2 -delete 2>/dev/null || true
  # bounded: a build that hangs is reported, not waited on
  echo "setup: DeepSpeed's shm op (built once, then loaded in seconds) ..." >&2
  DS_ACCELERATOR=cpu timeout 900 "$VENV/bin/python" -c \
    "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load(verbose=False)" >/dev/null 2>&1 \
    || echo "warning: DeepSpeed's shm op did not build (exit $?); the first DeepSpeed run will try again" >&2
}

# JupyterLab 4.6 sends widget messages to kernel subshells, which ipykernel 7 runs on threads of their own:
# two slider moves then draw one matplotlib figure at once. The course's widgets take a lock for that
# (course/widgets.py); the project's JupyterLab also keeps comms on the main shell.
lab_settings() {
  mkdir -p "$VENV/share/jupyter/lab/settings"
  cp scripts/jupyter_lab_overrides.json "$VENV/share/jupyter/lab/settings/overrides.json"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  lab_settings
  warm_deepspeed
  exit 0
fi
echo "Setting up $VENV (torch: $TORCH) ..."
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip
# torch first and on its own, so its --index-url (if any) applies to it alone.
# shellcheck disable=SC2086
pip install $TORCH
pip install -r requirements-dev.txt
# DeepSpeed (a peer for comparisons, never imported by the course packages) builds against the
# torch installed above; build isolation would fetch a second, multi-GB torch.
pip install --no-build-isolation -r requirements-peers.txt
pip install --no-deps --no-build-isolation -e .
lab_settings
warm_deepspeed
echo "$want" > "$stamp"
echo "Environment ready: $VENV"
