#!/usr/bin/env bash
# Set up .venv and run the daemon on a simulated 8-GPU node (no GPU needed).
# Extra arguments go to `gpu-exporter serve`, e.g. --listen-address 127.0.0.1:9449 or
# --simulate faults. On a real GPU node run `.venv/bin/gpu-exporter serve` instead.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
ensure_venv
case " $* " in
  *" --simulate"*) exec "$VENV/bin/gpu-exporter" serve "$@" ;;
  *) exec "$VENV/bin/gpu-exporter" serve --simulate mixed "$@" ;;
esac
