"""Which routed-expert tensors a placement keeps in host RAM, and how llama.cpp is told: -ot values, the user's
own pins as llama.cpp resolves them, the variants compared with --n-cpu-moe, and the placement that keeps the
most expert bytes on the device (the knapsack; optimal.py ranks them by the speed model).

A placement is the set of routed-expert tensors kept in host RAM. It is written as the shortest
-ot value we can make: layers grouped by which expert kinds they keep on the host, each group one
`blk\\.(<layer range>)\\.ffn_(<kinds>)_exps=CPU` pattern. llama-bench separates patterns with ';'
(its ',' separates sweep values); llama-server and llama-fit-params use ','.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Collection

import numpy as np

from ..core.errors import MoeplaceError
from ..model.memory import Pins
from ..model.meta import ModelMeta
from ..model.metadata import EXPERT_TENSOR
from ..runtime.llama_names import is_host


def _digits(a: int, b: int) -> str:
    return str(a) if a == b else "[0-9]" if (a, b) == (0, 9) else f"[{a}-{b}]"


def _same_length(a: str, b: str) -> list[str]:
    """Regex alternatives for the integers a..b written with the same number of digits."""
    if len(a) == 1:
        return [_digits(int(a), int(b))]
    if a[0] == b[0]:
        return [a[0] + rest for rest in _same_length(a[1:], b[1:])]
    tail = len(a) - 1
    first, last = int(a[0]), int(b[0])
    out = []
    if a[1:] != "0" * tail:
        out += [a[0] + rest for rest in _same_length(a[1:], "9" * tail)]
        first += 1
    keep_last = b[1:] == "9" * tail
    if first <= (last if keep_last else last - 1):
        out.append(_digits(first, last if keep_last else last - 1) + "[0-9]" * tail)
    if not keep_last:
        out += [b[0] + rest for rest in _same_length("0" * tail, b[1:])]
    return out


def int_range_regex(lo: int, hi: int) -> str:
    """A regex matching exactly the decimal integers lo..hi (no leading zeros), e.g. 0..17 -> [0-9]|1[0-7]."""
    if lo > hi or lo < 0:
        raise ValueError(f"bad layer range {lo}..{hi}")
    parts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10**width - 1)
        parts += _same_length(str(a), str(b))
    return "|".join(parts)


def layers_regex(layers: list[int]) -> str:
    runs: list[tuple[int, int]] = []
    for il in sorted(set(layers)):
        if runs and il == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], il)
        else:
            runs.append((il, il))
    alternatives = [int_range_regex(a, b) for a, b in runs]
    joined = "|".join(alternatives)
    return f"({joined})" if "|" in joined else joined


def _kinds_regex(kinds: set[str]) -> str:
    ordered = sorted(kinds, key=["up", "down", "gate", "gate_up"].index)
    return ordered[0] if len(ordered) == 1 else "(" + "|".join(ordered) + ")"


def ot_value(cpu_tensors: set[str], separator: str = ";") -> str:
    """The -ot value that keeps exactly these expert tensors on the host (empty: none)."""
    by_layer: dict[int, set[str]] = defaultdict(set)
    chexps: set[str] = set()
    for name in cpu_tensors:
        m = EXPERT_TENSOR.match(name)
        if not m:
            raise ValueError(f"{name} is not a routed-expert tensor")
        by_layer[int(m[1])].add(m[2])
        if m[3]:
            chexps.add(m[2])
    groups: dict[frozenset[str], list[int]] = defaultdict(list)
    for il, kinds in by_layer.items():
        groups[frozenset(kinds)].append(il)
    suffix = "(ch|)exps" if chexps else "exps"
    patterns = [
        f"blk\\.{layers_regex(layers)}\\.ffn_{_kinds_regex(set(kinds))}_{suffix}=CPU"
        for kinds, layers in sorted(groups.items(), key=lambda g: min(g[1]))
    ]
    return separator.join(patterns)


def expert_tensors(meta: ModelMeta, layers: list[int], kinds: set[str] | None = None) -> set[str]:
    """The routed-expert tensors (weights, biases) of these layers, optionally only some kinds."""
    out = set()
    for il in layers:
        for name in meta.layers[il].expert_tensors:
            m = EXPERT_TENSOR.match(name)
            if m and (kinds is None or m[2] in kinds):
                out.add(name)
    return out


def host_layers(tensors: Collection[str]) -> set[int]:
    """The layers these routed-expert tensors belong to: each one on the host costs decode two hops."""
    return {int(m[1]) for m in map(EXPERT_TENSOR.match, tensors) if m}


def tensor_bytes(meta: ModelMeta, tensors: set[str]) -> int:
    sizes = {n: b for layer in meta.layers for n, b in layer.expert_tensors.items()}
    return sum(sizes[t] for t in tensors)


def variants(meta: ModelMeta, n: int) -> dict[str, set[str]]:
    """Placements to compare with --n-cpu-moe n, at (about) the same host-resident expert bytes."""
    n_layer = meta.n_layer
    first = expert_tensors(meta, list(range(n)))
    target = tensor_bytes(meta, first)
    out = {"first_n_ot": first, "last_n": expert_tensors(meta, list(range(n_layer - n, n_layer)))}
    step = max(1, n_layer // n) if n else 1
    out["interleaved"] = expert_tensors(meta, list(range(0, n_layer, step))[:n])
    # up+down on the host, gate on the device: take layers until the bytes match.
    updown: set[str] = set()
    for il in range(n_layer):
        if tensor_bytes(meta, updown) >= target:
            break
        updown |= expert_tensors(meta, [il], {"up", "down"})
    out["up_down"] = updown
    return out


def _groups(meta: ModelMeta) -> list[tuple[int, str, set[str], int]]:
    """(layer, kind, tensors, bytes) per layer and expert kind: what one -ot kind pattern moves."""
    out = []
    for layer in meta.layers:
        kinds: dict[str, set[str]] = defaultdict(set)
        for name in layer.expert_tensors:
            m = EXPERT_TENSOR.match(name)
            if m:
                kinds[m[2]].add(name)
        for kind, names in sorted(kinds.items()):
            out.append((layer.index, kind, names, sum(layer.expert_tensors[n] for n in names)))
    return out


def optimal_placement(
    meta: ModelMeta,
    budget_bytes: float,
    host_layer_bytes: float = 0.0,
    pins: Pins = Pins(),
    max_units: int = 20_000,
) -> set[str]:
    """The host set that keeps the most expert bytes on the device within the budget, less `host_layer_bytes`
    for each layer with an expert on the host: a knapsack over each layer's choice of expert kinds to keep. The
    user's pins stand: their host tensors stay on the host, their device tensors on the device (taking budget).

    Every expert byte is read with the same probability (top-k of E), so predicted decode time falls with every
    device-resident byte, and rises by a layer's hops when any of its experts is on the host (their cost in
    resident bytes: speed.host_layer_bytes; 0 leaves bytes alone). Groups are (layer, kind), as -ot can move
    them; on ties later layers stay on the device, so a model whose layers are alike gets --n-cpu-moe N plus at
    most a partial layer.
    """

    sizes = {name: size for layer in meta.layers for name, size in layer.expert_tensors.items()}
    layers: dict[int, list[tuple[set[str], int]]] = defaultdict(list)
    pinned_host_layers = set()
    for layer, _, names, _ in _groups(meta):
        free = names - pins.host - pins.device
        if free:
            layers[layer].append((free, sum(sizes[n] for n in free)))
        if names & pins.host:
            pinned_host_layers.add(layer)
    host = set(pins.host) | {name for groups in layers.values() for names, _ in groups for name in names}
    budget_bytes -= sum(sizes[n] for n in pins.device)
    if budget_bytes <= 0 or not layers:
        return host
    unit = max(2**20, budget_bytes / max_units)
    capacity = int(budget_bytes // unit)
    best = np.zeros(capacity + 1)  # the most value within each capacity, over the layers placed so far
    choices = []
    for layer in sorted(layers, reverse=True):  # last layer first: it wins ties
        options = _layer_options(layers[layer], unit, host_layer_bytes, layer in pinned_host_layers)
        merged, choice = best + options[0][1], np.zeros(capacity + 1, dtype=np.int8)
        for i, (weight, value, _) in enumerate(options[1:], start=1):
            if weight > capacity:
                continue
            candidate = best[: capacity + 1 - weight] + value
            better = candidate > merged[weight:]  # strict: on ties this (earlier) layer keeps less
            merged[weight:] = np.where(better, candidate, merged[weight:])
            choice[weight:] = np.where(better, i, choice[weight:])
        best = merged
        choices.append((options, choice))
    c = capacity
    for options, choice in reversed(choices):
        weight, _, resident = options[choice[c]]
        host -= resident
        c -= weight
    return host


def _layer_options(
    groups: list[tuple[set[str], int]], unit: float, host_layer_bytes: float, pinned_on_host: bool
) -> list[tuple[int, float, set[str]]]:
    """Each subset of a layer's free `groups` (tensors, bytes) it may keep on the device, as the knapsack weighs
    it: (weight in `unit`s, value, tensors kept); keeping none first. A layer with an expert left on the host
    (`pinned_on_host`: one the user pins there) pays `host_layer_bytes`."""
    options: list[tuple[int, float, set[str]]] = [(0, -host_layer_bytes, set())]
    for kept in itertools.chain.from_iterable(itertools.combinations(groups, k) for k in range(1, len(groups) + 1)):
        weight = sum(int(-(-size // unit)) for _, size in kept)  # round up: never over the budget
        resident = set().union(*(names for names, _ in kept))
        on_host = len(kept) < len(groups) or pinned_on_host
        options.append((weight, sum(size for _, size in kept) - (host_layer_bytes if on_host else 0.0), resident))
    return options


def matching_tensors(overrides: str | None, names: list[str]) -> set[str]:
    """The tensors an -ot value (rules joined by ';') sends to the host, as llama.cpp matches them: regex_search,
    the first matching rule wins, and a rule naming a device (llama-fit-params writes some over several devices:
    `blk\\.4\\.ffn_down.*=CUDA0`) keeps its tensors there."""
    rules = [rule.rsplit("=", 1) for rule in (overrides or "").split(";") if rule]

    def to_host(name: str) -> bool:
        buffer = next((buffer for pattern, *buffer in rules if re.search(pattern, name)), None)
        return buffer is not None and (not buffer or is_host(buffer[0]))

    return {n for n in names if to_host(n)}


# The buffers llama-server's -ot accepts: the CPU's, and each device's own (it lists them when given another).
_OT_BUFFER = re.compile(r"CPU|(?:CUDA|ROCm|Vulkan|MTL|SYCL|CANN|MUSA|OpenCL)\d+|RPC\d*\[[^\]]+\]")


def override_rules(values: list[str]) -> tuple[str, ...]:
    """The -ot rules as llama-server reads them: each value a ','-separated list of PATTERN=BUFFER (the pattern
    ends at the first '='), -ot repeatable, BUFFER the CPU or a device."""
    rules = []
    for value in values:
        for rule in value.split(","):
            pattern, eq, buffer = rule.partition("=")
            if not eq or not pattern:
                raise MoeplaceError(
                    f"-ot {rule!r}: write PATTERN=BUFFER, e.g. 'blk\\.1\\.ffn_.*_exps=CPU' (',' between rules)."
                )
            if not _OT_BUFFER.fullmatch(buffer):
                raise MoeplaceError(
                    f"-ot {rule!r}: llama.cpp knows no buffer {buffer!r}; use CPU, or a device such as CUDA0, ROCm0, "
                    "Vulkan0, MTL0 or SYCL0."
                )
            try:
                re.compile(pattern)
            except re.error as e:
                raise MoeplaceError(f"-ot {rule!r}: the pattern is not a regular expression ({e}).") from None
            rules.append(rule)
    return tuple(rules)


def read_pins(meta: ModelMeta, values: list[str]) -> Pins:
    """The user's -ot values resolved to the expert tensors each keeps on the host or on the device (the first
    matching rule wins, as in llama.cpp); a rule that moves no routed expert is refused, since the plan could
    not account for it."""
    rules = override_rules(values)
    names = [t for layer in meta.layers for t in layer.expert_tensors]
    patterns = [(rule, re.compile(rule.partition("=")[0]), rule.partition("=")[2]) for rule in rules]
    host: set[str] = set()
    device: set[str] = set()
    used: set[str] = set()
    for name in names:
        for rule, pattern, buffer in patterns:
            if pattern.search(name):
                (host if buffer == "CPU" else device).add(name)
                used.add(rule)
                break
    for rule in rules:
        if rule not in used:
            example = names[0] if names else "none"
            raise MoeplaceError(
                f"-ot {rule!r} decides no routed-expert tensor of this model (e.g. {example}), so the plan cannot "
                "count it; moeplace plans where experts go."
            )
    return Pins(frozenset(host), frozenset(device), rules)
