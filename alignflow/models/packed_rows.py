"""A decoder's forward over a padded batch without computing the padding, or a shared prefix twice.

Preference rows differ wildly in length, so a batch padded to its longest row spends much of
a training step on padding (HH-RLHF pairs in SmolLM2's bench: 55-63% of the slots were real
tokens). And rows often begin alike: a DPO pair's chosen and rejected answers follow the same
prompt, GRPO's generations of a group follow theirs (SmolLM2's math bench: 70 of a row's ~110
tokens). transformers skips padding only with FlashAttention's variable-length kernels, which a
CPU lacks, and computes every shared prefix once per row. :func:`packed_forward` instead lays
the rows' real tokens end to end into fewer rows, a prefix that several rows share once, and
runs the decoder body once over them with a mask under which every token sees exactly the
tokens before it in its own rows; every token's hidden state then goes back to each place the
padded forward would have left it (a shared one to all of its rows, so its gradient is the sum
of theirs). Each token keeps the position and the context it had in its own row, so the
result is that of the padded forward (rounding aside); padding slots come back as zeros, which
nothing downstream reads.

Two rows share a token when they agree on it and on everything before it, ids and positions
alike (the hidden state of a causal decoder depends on nothing else). Sorted by their tokens,
rows that share a prefix sit side by side and each row shares with the row before it the most
it shares with any earlier one, so a row's new tokens are those after that common prefix, and
the rows that hold a slot form a run of the sorted order: a token sees a slot when the slot
comes before it and the slot's run covers the token's own run (an ancestor in the tree the
prefixes form). Rows that share at least half of the shorter one join a group, and groups
are packed first fit, longest first, into rows of a width chosen by a cost model of the layer
(its weights' products per slot, attention per slot and key it sees, :func:`padded_cost`):
the batch's width or a few times it, never to sizes a compiled layer would take as another
variant than the batch's (:func:`layer_variant`). A group wider than the rows is split.

The mask is built here from the rows, not left to transformers' packed-sequence detection:
that splits sequences where ``position_ids`` restart, and a left-padded row numbered by column
continues its neighbour's count. Only the attention implementations whose mask is a plain
tensor (``sdpa``, ``eager``, alignflow's CPU attention) take a packed mask; other calls (a
cache, embeddings instead of ids, a batch whose packing would cost more than it saves) are left
to the caller's plain forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from alignflow.models.cpu_attention import CPU_ATTENTION, kernel_choice
from alignflow.models.fixed_cache_decoding import DECODER_TYPES, attends_whole_context

# a mask given to the attention as a 4D tensor: additive for eager, bool for the others
PACKABLE_ATTENTION = frozenset({"sdpa", "eager", CPU_ATTENTION})
PLAIN_ARGUMENTS = frozenset({"input_ids", "attention_mask", "position_ids", "use_cache", "return_dict"})
UNASKED_OUTPUTS = frozenset({"output_attentions", "output_hidden_states"})  # packable when false
Token = tuple[int, int]  # (id, position)
Kernel = Callable[[int, int], object]  # (rows, width) -> what a compiled layer specialises on
# what one attention score costs besides its products, in FLOPs of the layer's matrix products:
# masking it, the fp32 softmax and its backward. Measured on SmolLM2's packed GRPO and DPO
# batches (an AMX Xeon, 226-333 keys, compiled layers): attention took ~11x its products' FLOPs
SCORE_OVERHEAD_FLOPS = 2600


@dataclass(frozen=True)
class PackPlan:
    """Where each real token of a ``[rows, width]`` batch goes in ``[packed_rows, packed_width]``.

    Slots are numbered flat; a slot's rows are the run ``first ..= last`` of the batch's rows in
    sorted order (a filler slot: ``-1 - slot`` for both, so that it sees only itself)."""

    packed_rows: int
    packed_width: int
    source: torch.Tensor  # flat index of each real token in the padded batch
    target: torch.Tensor  # the slot holding it (a shared slot holds several rows' tokens)
    fill_source: torch.Tensor  # one real token per filled slot, to fill it from
    fill_target: torch.Tensor  # that slot
    first: torch.Tensor  # [packed_rows, packed_width]
    last: torch.Tensor  # [packed_rows, packed_width]


@dataclass
class PackingCounts:
    """What :func:`last_hidden_state` did for one body: its forwards, how many of them packed,
    the real tokens in them, and how many of those the body computed (a shared prefix once)."""

    forwards: int = 0
    packed: int = 0
    tokens: int = 0
    computed: int = 0

    def add(self, plan: PackPlan, packed: bool) -> None:
        self.forwards += 1
        self.packed += packed
        self.tokens += len(plan.source)
        self.computed += len(plan.fill_target)

    @property
    def computed_share(self) -> float:
        """The share of real tokens the body computed (1.0 before any forward)."""
        return self.computed / self.tokens if self.tokens else 1.0

    def describe(self) -> str:
        """``off``, or how many forwards were packed and what share of their tokens ran."""
        if not self.packed:
            return "off"
        forwards = f"{self.packed} of {self.forwards} forwards"
        return f"on ({forwards}, {self.computed} of {self.tokens} tokens computed)"


def packing_counts(body: Any) -> PackingCounts:
    """The counts kept on ``body`` (new, zero, where it has none yet)."""
    counts = getattr(body, "packing_counts", None)
    if counts is None:
        counts = PackingCounts()
        body.packing_counts = counts
    return counts


def first_fit_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices grouped into bins of at most ``capacity`` tokens, longest rows placed first,
    each into the first bin with room; a row longer than ``capacity`` gets a bin of its own."""
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        size = lengths[row]
        spot = next((i for i, free in enumerate(room) if free >= size), None)
        if spot is None:
            bins.append([row])
            room.append(capacity - size)
        else:
            bins[spot].append(row)
            room[spot] -= size
    return bins


def common_prefix(a: list[Token], b: list[Token]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def prefix_groups(lengths: list[int], commons: list[int], capacity: int) -> tuple[list[list[int]], list[int]]:
    """Runs of the sorted rows (their ``lengths``, and ``commons``: the leading tokens each shares
    with the row before it) that share a prefix worth sharing, each holding at most ``capacity``
    tokens, and how many leading tokens each row takes from the row before it (0 where a group
    starts)."""
    groups: list[list[int]] = []
    shared: list[int] = []
    size = 0
    for t, (length, common) in enumerate(zip(lengths, commons, strict=True)):
        worth = common and 2 * common >= min(lengths[t - 1], length)
        if worth and size + length - common <= capacity:
            groups[-1].append(t)
            shared.append(common)
            size += length - common
        else:
            groups.append([t])
            shared.append(0)
            size = length
    return groups, shared


def padded_cost(rows: int, width: int, attention_share: float) -> float:
    """A decoder body's work over ``[rows, width]`` slots in units of one token's linear layers:
    each slot also attends over the row, at ``attention_share`` of that per slot it sees."""
    return rows * width * (1.0 + attention_share * width)


@dataclass(frozen=True)
class Layout:
    """Groups of sorted rows (with the prefix each row shares) and the bins they fill."""

    groups: list[list[int]]
    shared: list[int]
    bins: list[list[int]]
    packed_width: int


def layout(lengths: list[int], commons: list[int], capacity: int) -> Layout:
    """Groups of at most ``capacity`` tokens packed first fit, longest first, into bins of
    ``capacity`` (a row alone may be wider)."""
    groups, shared = prefix_groups(lengths, commons, capacity)
    sizes = [sum(lengths[t] - shared[t] for t in group) for group in groups]
    bins = first_fit_bins(sizes, capacity)
    return Layout(groups, shared, bins, max(sum(sizes[g] for g in members) for members in bins))


def real_columns(attention_mask: torch.Tensor) -> list[list[int]]:
    """Each row's columns that hold a real token (``attention_mask`` 1)."""
    real = attention_mask.bool()
    return [torch.nonzero(real[row])[:, 0].tolist() for row in range(real.shape[0])]


def capacities(width: int, total: int) -> list[int]:
    """Packed widths worth trying: the batch's, two to eight times it, and the whole batch in
    one row where that is narrower."""
    return sorted(w for w in {width, *(width * k for k in (2, 4, 8)), total} if w >= width)


def pack_plan(
    attention_mask: torch.Tensor,
    input_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    attention_share: float = 0.0,
    variant: Kernel | None = None,
) -> PackPlan | None:
    """The cheapest packing (:func:`padded_cost`) of a batch whose padding is marked by
    ``attention_mask`` (``[rows, width]``, 1 for real tokens), prefixes shared where
    ``input_ids`` are given (positions: ``position_ids``, else the column), that a compiled
    layer takes as the batch's own ``variant``; None where none costs less than the padded batch."""
    if attention_mask.dim() != 2 or attention_mask.shape[0] < 2:
        return None
    rows, width = attention_mask.shape
    columns = real_columns(attention_mask)
    if input_ids is None:  # no sharing: every row's tokens are its own
        tokens = [[(row, c) for c in cols] for row, cols in enumerate(columns)]
    else:
        positions = torch.arange(width).expand(rows, width) if position_ids is None else position_ids
        ids, pos = input_ids.tolist(), positions.expand(rows, width).tolist()
        tokens = [[(ids[row][c], pos[row][c]) for c in cols] for row, cols in enumerate(columns)]
    order = sorted(range(rows), key=lambda r: tokens[r])
    lengths = [len(tokens[row]) for row in order]
    commons = [0] + [common_prefix(tokens[a], tokens[b]) for a, b in zip(order, order[1:], strict=False)]
    choices = [layout(lengths, commons, capacity) for capacity in capacities(width, sum(lengths))]
    if variant is not None:
        choices = [c for c in choices if variant(len(c.bins), c.packed_width) == variant(rows, width)]
    if not choices:
        return None
    best = min(choices, key=lambda c: padded_cost(len(c.bins), c.packed_width, attention_share))
    if padded_cost(len(best.bins), best.packed_width, attention_share) >= padded_cost(
        rows, width, attention_share
    ):
        return None
    return plan_of(best, order, columns, width, attention_mask.device)


def padded_plan(attention_mask: torch.Tensor) -> PackPlan:
    """Every row alone at the batch's width, its real tokens first: the padded batch's cost, as
    a plan, so that a batch not worth packing reaches the body as a packed one does. A compiled
    layer guards on what its arguments look like (which are given, the positions' and the mask's
    strides and bases) and compiled again mid-run where packed and padded calls alternated."""
    rows, width = attention_mask.shape
    columns = real_columns(attention_mask)
    alone = [[row] for row in range(rows)]
    unpacked = Layout(groups=alone, shared=[0] * rows, bins=alone, packed_width=width)
    return plan_of(unpacked, list(range(rows)), columns, width, attention_mask.device)


def plan_of(chosen: Layout, order: list[int], columns: list[list[int]], width: int, device: Any) -> PackPlan:
    """The index tensors that carry out ``chosen``: each bin's groups one after another, each
    group as its first row's tokens and then every later row's tokens after its shared prefix."""
    bins, packed_width = chosen.bins, chosen.packed_width
    source: list[int] = []
    target: list[int] = []
    fill_source: list[int] = []
    fill_target: list[int] = []
    first = list(range(-1, -1 - len(bins) * packed_width, -1))
    last = list(first)
    for slot_row, members in enumerate(bins):
        free = slot_row * packed_width
        for group in members:
            previous: list[int] = []
            for t in chosen.groups[group]:
                row, keep, cols = order[t], chosen.shared[t], columns[order[t]]
                for slot in previous[:keep]:
                    last[slot] = t
                new = list(range(free, free + len(cols) - keep))
                for slot in new:
                    first[slot] = last[slot] = t
                free += len(new)
                flat = [row * width + c for c in cols]
                previous = previous[:keep] + new
                source += flat
                target += previous
                fill_source += flat[keep:]
                fill_target += new
    shape = (len(bins), packed_width)
    return PackPlan(
        len(bins),
        packed_width,
        torch.tensor(source, device=device),
        torch.tensor(target, device=device),
        torch.tensor(fill_source, device=device),
        torch.tensor(fill_target, device=device),
        torch.tensor(first, device=device).view(shape),
        torch.tensor(last, device=device).view(shape),
    )


def packed_attention_mask(plan: PackPlan, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """``[packed_rows, 1, w, w]``: a slot sees the earlier slots that every one of its rows holds
    (a filler slot only itself), as an additive mask for eager attention, else a bool one."""
    first, last = plan.first, plan.last
    covers = (first[:, None, :] <= first[:, :, None]) & (last[:, :, None] <= last[:, None, :])
    width = plan.packed_width
    causal = torch.ones(width, width, dtype=torch.bool, device=first.device).tril()
    allowed = (covers & causal)[:, None]
    if implementation != "eager":
        return allowed
    additive = torch.zeros(allowed.shape, dtype=dtype, device=first.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)


def packed_forward(
    body: Any, plan: PackPlan, input_ids: torch.Tensor, position_ids: torch.Tensor | None, **kwargs: Any
) -> torch.Tensor:
    """The body's last hidden states for the padded ``input_ids`` (``[rows, width, d]``, zeros
    at padding), computed over the packed rows of ``plan``. Positions are ``position_ids``
    where given, else each token's column, as the padded forward numbers them."""
    rows, width = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(width, device=input_ids.device)
    shape = (plan.packed_rows, plan.packed_width)

    def packed(values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros(shape[0] * shape[1])
        taken = values.reshape(-1).index_select(0, plan.fill_source)
        return out.index_copy(0, plan.fill_target, taken).view(shape)

    mask = packed_attention_mask(plan, body.config._attn_implementation, body.dtype)
    ids, positions = packed(input_ids), packed(position_ids.expand(rows, width))
    hidden = body(input_ids=ids, position_ids=positions, attention_mask=mask, **kwargs).last_hidden_state
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = flat.new_zeros(rows * width, flat.shape[-1])
    return out.index_copy(0, plan.source, flat.index_select(0, plan.target)).view(rows, width, -1)


def attention_share(config: Any) -> float:
    """A decoder layer's attention work per token per token it sees, over its weights' FLOPs per
    token: each score's products (queries times keys, weights times values) and
    :data:`SCORE_OVERHEAD_FLOPS` for the rest of it."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    projections = config.hidden_size * head_dim * (2 * heads + 2 * kv_heads)
    weights = projections + 3 * config.hidden_size * config.intermediate_size
    return heads * (4 * head_dim + SCORE_OVERHEAD_FLOPS) / (2 * weights)


def layer_variant(config: Any) -> Kernel:
    """What a compiled decoder layer specialises on for a ``[rows, width]`` batch: a batch of one
    row (torch.compile takes sizes 0 and 1 as constants), and the branch alignflow's CPU
    attention takes on the keys and on the scores a training forward keeps
    (:func:`~alignflow.models.cpu_attention.kernel_choice`). A packing that changed either would
    have a compiled layer compile again (~20-25 s on SmolLM2, in the middle of a run) and run at
    another cost than the one modelled."""
    heads, keeps_weights = config.num_attention_heads, torch.is_grad_enabled()
    branches = config._attn_implementation == CPU_ATTENTION

    def variant(rows: int, width: int) -> object:
        branch = kernel_choice(rows, heads, width, width, keeps_weights) if branches else None
        return rows == 1, branch

    return variant


def can_pack(body: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``body(**kwargs)`` is a plain padded forward of a decoder this module packs
    exactly: a type whose every layer is causal over the whole row, a tensor mask."""
    config = getattr(body, "config", None)
    if getattr(config, "model_type", None) not in DECODER_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) not in PACKABLE_ATTENTION:
        return False
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if not isinstance(ids, torch.Tensor) or not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        return False
    if ids.dim() != 2 or not attends_whole_context(config, ids.shape[1]):
        return False
    return set(kwargs) <= PLAIN_ARGUMENTS and not kwargs.get("use_cache")


def given_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments that ask for something: a wrapper (PEFT's) passes every one it knows,
    ``None`` or false where its caller gave nothing."""
    return {k: v for k, v in kwargs.items() if v is not None and not (k in UNASKED_OUTPUTS and v is False)}


def last_hidden_state(body: Any, **kwargs: Any) -> torch.Tensor:
    """``body(**kwargs).last_hidden_state`` at every real token (zeros at padding): over packed
    rows where that is exact and costs less, else over the rows as they are (:func:`padded_plan`)."""
    given = given_arguments(kwargs)
    if not can_pack(body, given):
        return body(**kwargs).last_hidden_state
    ids, positions, config = given["input_ids"], given.get("position_ids"), body.config
    share, variant = attention_share(config), layer_variant(config)
    plan = pack_plan(given["attention_mask"], ids, positions, share, variant)
    packed = plan is not None
    plan = plan or padded_plan(given["attention_mask"])
    packing_counts(body).add(plan, packed)
    rest = {k: v for k, v in given.items() if k not in {"input_ids", "attention_mask", "position_ids"}}
    return packed_forward(body, plan, ids, positions, **rest)
