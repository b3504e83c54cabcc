#!/usr/bin/env python3
"""Stand-in nvidia-smi for the dev cluster's fake nodes.

Installed as `$DIR/nodes/<node>/bin/nvidia-smi`; it answers from `../gpus.csv`
(real `nvidia-smi --query-gpu=... --format=csv` output, header included) and
`../cuda_version`. Supported: `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`
(any subset and order of the CSV's fields, plus `count`),
`--query-remapped-rows=FIELDS` (from the CSV's `remapped_rows.*` columns), `-i/--id`,
`-L`, `nvlink -s` / `nvlink -e` (from `../nvlink_status.txt` / `../nvlink_errors.txt`;
without them each GPU's header line alone, as for GPUs without NVLink), and the plain banner. The clock reasons answer under both names,
`clocks_event_reasons.*` and `clocks_throttle_reasons.*`, unless the CSV names them
`clocks_throttle_reasons.*`: then, like a driver before 535, only that name is valid.
Without gpus.csv it fails like a node whose driver is not loaded.
Kept to Python 3.6 syntax like the probe.
"""

import os
import sys

NODE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSV_PATH = os.path.join(NODE_DIR, "gpus.csv")

# Names nvidia-smi accepts for the same property.
ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
EVENT = "clocks_event_reasons."
THROTTLE = "clocks_throttle_reasons."
# Valid nvidia-smi fields this stand-in has no data for: answered "[N/A]".
KNOWN_FIELDS = {"serial", "compute_cap", "memory.used", "memory.free", "temperature.gpu",
                "utilization.gpu", "utilization.memory", "power.draw", "pstate",
                "persistence_mode", "vbios_version", "pci.device_id", "gpu_serial",
                "clocks.applications.graphics", "clocks.applications.memory"}
NVLINK_FILES = {"-s": "nvlink_status.txt", "--status": "nvlink_status.txt",
                "-e": "nvlink_errors.txt", "--errorcounters": "nvlink_errors.txt"}

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
             "driver. Make sure that the latest NVIDIA driver is installed and running.")


def split_row(line):
    return [cell.strip() for cell in line.split(", ")]


def load_gpus():
    """Return (header, rows): header is [(field, unit or None)], rows are dicts."""
    with open(CSV_PATH) as handle:
        lines = [line.rstrip("\n") for line in handle if line.strip()]
    header = []
    for cell in split_row(lines[0]):
        field, _, unit = cell.partition(" [")
        header.append((field, unit.rstrip("]") or None))
    rows = [dict(zip([f for f, _ in header], split_row(line))) for line in lines[1:]]
    return header, rows


def read_cuda_version():
    try:
        with open(os.path.join(NODE_DIR, "cuda_version")) as handle:
            return handle.read().strip()
    except OSError:
        return "N/A"


def parse_args(argv):
    """Return {option: value} for the options this stand-in understands."""
    options = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--query-gpu", "--query-remapped-rows", "--format", "--id", "-i") and not eq:
            if i + 1 >= len(argv):
                fail(f"Option {name} requires a value.")
            value = argv[i + 1]
            i += 1
        if name == "-i":
            name = "--id"
        elif name == "--list-gpus":
            name = "-L"
        options[name] = value
        i += 1
    return options


def fail(message, code=2):
    sys.stdout.write(message + "\n")
    sys.exit(code)


def select(rows, ids):
    if ids is None:
        return rows
    wanted = {part.strip() for part in ids.split(",")}
    chosen = [r for r in rows if r.get("index") in wanted or r.get("uuid") in wanted
              or r.get("pci.bus_id") in wanted]
    if not chosen:
        fail("No devices were found", 6)
    return chosen


def canonical(field, header):
    """The CSV column a queried field reads: aliases, and the two clock-reason names."""
    name = ALIASES.get(field, field)
    names = {f for f, _ in header}
    if name.startswith(THROTTLE) and name not in names:
        name = EVENT + name[len(THROTTLE):]
    elif name.startswith(EVENT) and any(f.startswith(THROTTLE) for f in names):
        return field  # a driver before 535 knows only clocks_throttle_reasons.*
    return name


def query(options, header, rows, option="--query-gpu"):
    fmt = options.get("--format")
    if fmt is None:
        fail(f'"--format" must be specified when using "{option}".')
    flags = [part.strip() for part in fmt.split(",")]
    if flags[0] != "csv" or not set(flags[1:]) <= {"noheader", "nounits"}:
        fail(f'"{fmt}" is not a valid format.')
    units = dict(header)
    fields = [f.strip() for f in options[option].split(",") if f.strip()]
    if option == "--query-remapped-rows":
        bad = [f for f in fields if not f.startswith("remapped_rows.")
               and f not in ("gpu_bus_id", "gpu_uuid")]
        if bad:
            fail(f'Field "{bad[0]}" is not a valid field to query.')
    columns = [canonical(f, header) for f in fields]
    out = []
    if "noheader" not in flags:
        out.append(", ".join(f + (f" [{units[c]}]" if units.get(c) else "")
                             for f, c in zip(fields, columns)))
    for row in rows:
        out.append(", ".join(value_of(f, c, row, units, len(rows), "nounits" in flags)
                             for f, c in zip(fields, columns)))
    sys.stdout.write("".join(line + "\n" for line in out))


def value_of(field, name, row, units, count, nounits):
    if name == "count":
        return str(count)
    if name in row:
        value = row[name]
        unit = units.get(name)
        if nounits and unit and value.endswith(" " + unit):
            value = value[:-len(unit) - 1]
        return value
    if name in KNOWN_FIELDS:
        return "[N/A]"
    fail(f'Field "{field}" is not a valid field to query.')
    return ""


def banner(rows):
    driver = rows[0].get("driver_version", "N/A") if rows else "N/A"
    cuda = read_cuda_version()
    rule = "+" + "-" * 89 + "+"
    lines = [rule,
             f"| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda:<9}|",
             rule]
    for row in rows:
        lines.append(f"| {row.get('index', '?'):>3}  {row.get('name', '?'):<40} "
                     f"{row.get('pci.bus_id', '?'):<20} {row.get('memory.total', '?'):<18} |")
    lines.append(rule)
    sys.stdout.write("\n".join(lines) + "\n")


def nvlink(options, rows):
    """`nvidia-smi nvlink -s|-e`: the node's file, else the GPU headers alone."""
    wanted = next((NVLINK_FILES[o] for o in options if o in NVLINK_FILES), None)
    if wanted is None:
        fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
    path = os.path.join(NODE_DIR, wanted)
    if os.path.exists(path):
        with open(path) as handle:
            sys.stdout.write(handle.read())
        return
    for row in rows:
        sys.stdout.write(f"GPU {row.get('index')}: {row.get('name')} (UUID: {row.get('uuid')})\n")


def main(argv):
    if argv[:1] == ["nvlink"]:
        if not os.path.exists(CSV_PATH):
            fail(NO_DRIVER, 9)
        nvlink(argv[1:], load_gpus()[1])
        return 0
    options = parse_args(argv)
    if not os.path.exists(CSV_PATH):
        fail(NO_DRIVER, 9)
    header, rows = load_gpus()
    rows = select(rows, options.get("--id"))
    if "--query-gpu" in options:
        query(options, header, rows)
    elif "--query-remapped-rows" in options:
        query(options, header, rows, "--query-remapped-rows")
    elif "-L" in options:
        for row in rows:
            sys.stdout.write(f"GPU {row.get('index')}: {row.get('name')} (UUID: {row.get('uuid')})\n")
    else:
        banner(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
