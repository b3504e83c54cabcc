#!/bin/bash
# Re-capture the verbatim nvidia-smi text the unit tests parse (a developer tool).
# Run on a machine with an NVIDIA GPU: capture.sh OUTDIR. Each file holds one
# command's stdout, then its stderr and exit status after a "# stderr" / "# rc" line.
set -u
out=${1:?usage: capture.sh OUTDIR}
mkdir -p "$out"
base=index,name,uuid,driver_version,memory.total,pci.bus_id
health=persistence_mode,ecc.mode.current,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,temperature.gpu
cap() {  # cap FILE CMD...
  f=$out/$1; shift
  { echo "# \$ $*"; "$@" 2>/tmp/cap.err; rc=$?; echo "# stderr"; cat /tmp/cap.err; echo "# rc $rc"; } >"$f"
}
cap query-event.txt nvidia-smi --query-gpu=$base,$health,clocks_event_reasons.active --format=csv,noheader
cap query-throttle.txt nvidia-smi --query-gpu=$base,$health,clocks_throttle_reasons.active --format=csv,noheader
cap query-header.txt nvidia-smi --query-gpu=$base,$health,clocks_event_reasons.active --format=csv
cap remapped.txt nvidia-smi --query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv,noheader
cap badfield.txt nvidia-smi --query-gpu=index,clocks_event_reasons.bogus --format=csv,noheader
{ cap x nvidia-smi --help-query-gpu; cat "$out/x"; cap x nvidia-smi --help-query-remapped-rows; cat "$out/x"; rm -f "$out/x"; } >"$out/help.txt"
more=vbios_version,clocks.applications.graphics,clocks.applications.memory,gpu_recovery_action
cap query-more.txt nvidia-smi --query-gpu=$base,$health,$more,clocks_event_reasons.active --format=csv,noheader
cap q-full.txt nvidia-smi -q
cap nvlink-s.txt nvidia-smi nvlink -s
cap nvlink-e.txt nvidia-smi nvlink -e

{ cap x dmesg; tail -40 "$out/x"; cap x journalctl -k --no-pager -o short-unix -n 20; cat "$out/x"; cat /proc/uptime;
  ls -la /sys/class/infiniband 2>&1; for f in /sys/class/infiniband/*/ports/*/counters/*; do [ -r "$f" ] && echo "$f $(cat "$f")"; done;
  nvidia-smi; rm -f "$out/x"; } >"$out/kernel.txt" 2>&1
