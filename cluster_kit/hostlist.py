"""Expand and fold Slurm hostlists (pure; no Slurm needed).

The behaviour follows Slurm 22.05's own `scontrol show hostnames` (expand) and
`scontrol show hostlist` (fold), which the unit tests check differentially:

- items are separated by commas or whitespace; empty items are ignored;
- `gpu[001-004,010]` keeps the zero padding of each range's low bound;
- several bracket groups in one name (`rack[1-2]-gpu[01-02]`) expand to their
  product, in Slurm's order: the last group varies fastest, then the first,
  second, ... group (for two groups that is plain row-major order);
- Slurm accepts no text after the last `]` (`gpu[1-2]-ib` is invalid);
- duplicates are kept, in the order given, by both expand and fold;
- fold merges only consecutive hosts (`n3,n1,n2` -> `n[3,1-2]`), as Slurm does.

Where Slurm is lenient by accident (an unbalanced `[`, blanks inside brackets,
`n[1-]`), this module raises ValueError instead of guessing.

`NodeSet` is the value to pass around once a hostlist is read: built once from
the text (`NodeSet("gpu[01-04]")`) or from names (`NodeSet.of(names)`), combined
with `|`, `&` and `-`, and folded back to text by `str()` where it is printed.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# Slurm refuses a single range of more hosts than this ("Too many hosts in range").
MAX_RANGE_HOSTS = 65536
# A whole expression names no more hosts either, so that `n[1-65536]x[1-65536]` (4 billion
# names) is refused before anything is built; the largest Slurm clusters are far smaller.
MAX_HOSTS = 65536

_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*\Z")
_SEPARATORS = ", \t\r\n"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")
_TRAILING_NUMBER = re.compile(r"(.*?)(\d+)\Z", re.DOTALL)


# ---------------------------------------------------------------- expand


def expand(expr: str) -> list[str]:
    """Return the host names of a Slurm hostlist expression, in Slurm's order.

    >>> expand("gpu[001-003,010],login1")
    ['gpu001', 'gpu002', 'gpu003', 'gpu010', 'login1']

    Raises ValueError naming the problem for unbalanced or nested brackets,
    reversed or empty ranges, text after the last `]` and characters other
    than letters, digits, `-`, `_` and `.`.
    """
    hosts: list[str] = []
    for item in _split_items(expr):
        hosts.extend(_expand_item(item, expr, MAX_HOSTS - len(hosts)))
    return hosts


def _split_items(expr: str) -> list[str]:
    """Split at separators outside brackets; check bracket balance."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            if depth:
                raise ValueError(f"invalid hostlist {expr!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"invalid hostlist {expr!r}: ']' without a matching '['")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    if depth:
        raise ValueError(f"invalid hostlist {expr!r}: '[' without a matching ']'")
    items.append("".join(current))
    return [item for item in items if item]


def _expand_item(item: str, expr: str, room: int) -> list[str]:
    """Expand one comma-free item such as `rack[1-2]-gpu[01-02]`, into at most `room` hosts."""
    parts = re.split(r"\[([^\]]*)\]", item)
    literals, groups = parts[0::2], parts[1::2]
    for literal in literals:
        _check_name_chars(literal, expr)
    if not groups:
        _check_count(1, room, expr)
        return [item]
    if literals[-1]:
        raise ValueError(
            f"invalid hostlist {expr!r}: Slurm accepts no text after the last ']' "
            f"({literals[-1]!r} in {item!r}); list such hosts one by one"
        )
    numbers = [_expand_group(group, expr, room) for group in groups]
    count = 1
    for group_numbers in numbers:
        count *= len(group_numbers)
        _check_count(count, room, expr)
    return [_join(literals, combo) for combo in _slurm_product(numbers)]


def _check_count(count: int, room: int, expr: str) -> None:
    if count > room:
        raise ValueError(f"invalid hostlist {expr!r}: it names more than {MAX_HOSTS} hosts")


def _check_name_chars(text: str, expr: str) -> None:
    if not _NAME_CHARS.match(text):
        bad = next(ch for ch in text if not _NAME_CHARS.match(ch))
        raise ValueError(
            f"invalid hostlist {expr!r}: character {bad!r} is not allowed in a host name "
            "(letters, digits, '-', '_' and '.' are)"
        )


def _expand_group(group: str, expr: str, room: int) -> list[str]:
    """Expand the inside of one bracket group (`001-004,010`) to number strings."""
    numbers: list[str] = []
    for part in group.split(","):
        numbers.extend(_expand_range(part, expr))
        _check_count(len(numbers), room, expr)
    return numbers


def _expand_range(part: str, expr: str) -> list[str]:
    match = _RANGE.match(part)
    if not match:
        what = "an empty range" if not part else f"the range {part!r}"
        raise ValueError(
            f"invalid hostlist {expr!r}: {what} is not N or N-M with decimal digits"
        )
    low_text, high_text = match.group(1), match.group(2) or match.group(1)
    low, high = int(low_text), int(high_text)
    if high < low:
        raise ValueError(f"invalid hostlist {expr!r}: the range {part!r} is reversed")
    if high - low + 1 > MAX_RANGE_HOSTS:
        raise ValueError(
            f"invalid hostlist {expr!r}: the range {part!r} has more than "
            f"{MAX_RANGE_HOSTS} hosts"
        )
    width = len(low_text)  # Slurm pads every number to the low bound's width
    return [str(n).zfill(width) for n in range(low, high + 1)]


def _slurm_product(groups: list[list[str]]) -> Iterator[tuple[str, ...]]:
    """Combinations in Slurm's order: last group fastest, then first, second, ..."""
    *leading, last = groups
    for reversed_combo in itertools.product(*reversed(leading)):
        for tail in last:
            yield tuple(reversed(reversed_combo)) + (tail,)


def _join(literals: list[str], numbers: tuple[str, ...]) -> str:
    pieces = [literals[0]]
    for number, literal in zip(numbers, literals[1:]):
        pieces.append(number)
        pieces.append(literal)
    return "".join(pieces)


# ---------------------------------------------------------------- fold


@dataclass
class _Run:
    """Consecutive hosts `prefix<low..high>` (number None: a name without digits)."""

    prefix: str
    low: int | None
    high: int | None
    width: int

    @property
    def padded(self) -> bool:
        return self.low is not None and len(str(self.low)) < self.width

    def accepts(self, other: _Run) -> bool:
        """Whether `other` (a single host) extends this run as Slurm would merge it."""
        if self.low is None or other.low is None or self.high is None:
            return False
        if other.prefix != self.prefix or other.low != self.high + 1:
            return False
        return other.width == self.width or not (self.padded or other.padded)

    def range_text(self) -> str:
        assert self.low is not None and self.high is not None
        low = str(self.low).zfill(self.width)
        if self.low == self.high:
            return low
        return f"{low}-{str(self.high).zfill(self.width)}"


def fold(hosts: Iterable[str]) -> str:
    """Fold host names into a Slurm hostlist, as `scontrol show hostlist` does.

    Order and duplicates are kept; only consecutive numbers with the same prefix
    and a compatible zero padding merge into one range, and neighbouring runs
    with the same prefix share one bracket:

    >>> fold(["gpu001", "gpu002", "gpu003", "gpu010", "login1"])
    'gpu[001-003,010],login1'
    """
    runs: list[_Run] = []
    for host in hosts:
        run = _parse_host(host)
        if runs and runs[-1].accepts(run):
            runs[-1].high = run.low
        else:
            runs.append(run)
    return ",".join(_format_group(group) for group in _group_by_prefix(runs))


def _parse_host(host: str) -> _Run:
    if not host or not _NAME_CHARS.match(host):
        raise ValueError(
            f"invalid host name {host!r}: use letters, digits, '-', '_' and '.' only"
        )
    match = _TRAILING_NUMBER.match(host)
    if not match:
        return _Run(host, None, None, 0)
    prefix, digits = match.group(1), match.group(2)
    return _Run(prefix, int(digits), int(digits), len(digits))


def _group_by_prefix(runs: list[_Run]) -> Iterator[list[_Run]]:
    """Neighbouring numbered runs with one prefix; names without digits alone."""
    group: list[_Run] = []
    for run in runs:
        if group and (run.low is None or group[0].prefix != run.prefix):
            yield group
            group = []
        group.append(run)
        if run.low is None:
            yield group
            group = []
    if group:
        yield group


def _format_group(group: list[_Run]) -> str:
    first = group[0]
    if first.low is None:
        return first.prefix
    if len(group) == 1 and first.low == first.high:
        return first.prefix + first.range_text()
    return f"{first.prefix}[{','.join(run.range_text() for run in group)}]"


# ---------------------------------------------------------------- NodeSet


class NodeSet:
    """An immutable set of node names: a Slurm hostlist as a value.

    >>> nodes = NodeSet("gpu[01-04]") - NodeSet("gpu03")
    >>> str(nodes), len(nodes), "gpu02" in nodes
    ('gpu[01-02,04]', 3, True)

    Iteration keeps Slurm's order (the order `expand` gives, or the order the
    names came in) with each node once; `|` appends the right side's new nodes,
    `&` and `-` keep the left side's order. `==` and the hash ignore the order,
    as for any set; `str()` folds in the set's order, so it is the shortest
    hostlist Slurm itself would print for these nodes in that order.
    """

    __slots__ = ("_members", "_nodes")

    _nodes: tuple[str, ...]
    _members: frozenset[str]

    def __init__(self, hostlist: str = "") -> None:
        """The nodes of a Slurm hostlist; raises ValueError as `expand` does."""
        if not isinstance(hostlist, str):
            raise TypeError(f"NodeSet takes a hostlist string, not {type(hostlist).__name__}; "
                            "use NodeSet.of(names) for node names")
        self._set_nodes(expand(hostlist))

    @classmethod
    def of(cls, names: Iterable[str]) -> NodeSet:
        """The nodes named one by one (duplicates dropped, order kept).

        Raises ValueError for a name that is not a single host name, as `fold` does.
        """
        if isinstance(names, NodeSet):
            return names
        if isinstance(names, str):
            raise TypeError("NodeSet.of takes node names, not one string; use NodeSet(hostlist)")
        nodes = list(dict.fromkeys(names))
        for name in nodes:
            _parse_host(name)
        return cls._unchecked(nodes)

    @classmethod
    def _unchecked(cls, nodes: Iterable[str]) -> NodeSet:
        """A NodeSet of names known to be valid and distinct."""
        node_set = cls.__new__(cls)
        node_set._set_nodes(nodes)
        return node_set

    def _set_nodes(self, nodes: Iterable[str]) -> None:
        ordered = tuple(dict.fromkeys(nodes))
        object.__setattr__(self, "_nodes", ordered)
        object.__setattr__(self, "_members", frozenset(ordered))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a NodeSet cannot be changed; build a new one with |, & or -")

    def __reduce__(self) -> tuple[Any, tuple[tuple[str, ...]]]:
        # copy and pickle rebuild through `of`: the slots cannot be set one by one
        return (NodeSet.of, (self._nodes,))

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: object) -> bool:
        return node in self._members

    def __or__(self, other: object) -> NodeSet:
        if not isinstance(other, NodeSet):
            return NotImplemented
        return NodeSet._unchecked(self._nodes + other._nodes)

    def __and__(self, other: object) -> NodeSet:
        if not isinstance(other, NodeSet):
            return NotImplemented
        return NodeSet._unchecked(n for n in self._nodes if n in other._members)

    def __sub__(self, other: object) -> NodeSet:
        if not isinstance(other, NodeSet):
            return NotImplemented
        return NodeSet._unchecked(n for n in self._nodes if n not in other._members)

    def __le__(self, other: object) -> bool:
        if not isinstance(other, NodeSet):
            return NotImplemented
        return self._members <= other._members

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeSet):
            return NotImplemented
        return self._members == other._members

    def __hash__(self) -> int:
        return hash(self._members)

    def __str__(self) -> str:
        return fold(self._nodes)

    def __repr__(self) -> str:
        return f"NodeSet({str(self)!r})"

    def sorted(self) -> NodeSet:
        """The same nodes in natural order (`gpu2` before `gpu10`), which folds shortest."""
        return NodeSet._unchecked(sorted(self._nodes, key=natural_key))


_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[str | tuple[int, str], ...]:
    """Natural sort key: `gpu2` before `gpu10`, then by text so the order is total.

    Text and digit runs alternate from the first part (which may be empty), so two
    keys compare text with text and numbers with numbers."""
    parts = _DIGIT_RUNS.split(name)
    return tuple((int(p), p) if i % 2 else p for i, p in enumerate(parts))
