"""The reference engine's model: a Llama-architecture transformers model with seeded random weights.

Nothing is downloaded. The weights come from ``torch.manual_seed(seed)`` and transformers' own
initialisation with ``initializer_range`` (0.5 by default): at transformers' default of 0.02 a
random Llama repeats one token forever, which proves nothing about the KV it was given; at 0.5
greedy output is varied. The model is always initialised on the CPU and then moved, so the same
seed gives the same weights on every device.

Prefill runs in chunks of whole blocks (``chunk_tokens``, a multiple of the block size), each
chunk attending to the cache of everything before it. Block b's K and V are therefore computed
from the same inputs with the same shapes whether blocks 0..b-1 were computed in this process or
loaded from kvctl: a run that loads a prefix and a run that recomputes everything (``--no-cache``)
are bitwise equal on the same device, so their logits can be compared at fp32's last bits.

Tensor parallelism (``TensorParallel``) shards attention by KV head, as serving engines do: rank
r keeps its query heads, its KV heads and the matching columns of ``o_proj``, whose partial output
is summed over ranks (``all_reduce``); the MLP and the head are replicated. Each rank's KV cache,
and so each rank's pages, hold only its own KV heads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The shape and seed of the random model. Two processes with equal specs hold equal weights."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 32000
    intermediate: int = 0  # 0: 8/3 of hidden, rounded up to a multiple of 64
    seed: int = 0
    init_range: float = 0.5
    dtype: str = "float32"
    max_positions: int = 32768

    def validate(self) -> None:
        """Raises ValueError naming every field that is out of range."""
        problems = []
        for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "max_positions"):
            if getattr(self, name) < 1:
                problems.append("%s %d: must be positive" % (name, getattr(self, name)))
        if self.heads >= 1 and self.hidden % self.heads:
            problems.append("hidden %d: must be a multiple of heads %d" % (self.hidden, self.heads))
        elif self.heads >= 1 and (self.hidden // self.heads) % 2:
            problems.append(
                "hidden / heads = %d: the head size must be even (rotary embedding)" % (self.hidden // self.heads)
            )
        if self.kv_heads >= 1 and self.heads % self.kv_heads:
            problems.append("heads %d: must be a multiple of kv_heads %d" % (self.heads, self.kv_heads))
        if self.intermediate < 0:
            problems.append("intermediate %d: must not be negative" % self.intermediate)
        if self.dtype not in DTYPES:
            problems.append("dtype %r: want one of %s" % (self.dtype, ", ".join(DTYPES)))
        if not self.init_range > 0:
            problems.append("init_range %g: must be positive" % self.init_range)
        if problems:
            raise ValueError("model: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def config(self) -> LlamaConfig:
        inter = self.intermediate or -(-(self.hidden * 8 // 3) // 64) * 64
        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=inter,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_positions,
            initializer_range=self.init_range,
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )

    def model_key(self) -> str:
        """A model key that names the weights: engines with different weights never share KV."""
        return "kvctl-hf-llama-l%d-h%d-a%d-kv%d-v%d-i%d-r%g-s%d-%s" % (
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.intermediate,
            self.init_range,
            self.seed,
            self.dtype,
        )


def build_model(spec: ModelSpec, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """The seeded random model, in eval mode, on device in spec's dtype."""
    spec.validate()
    cfg = spec.config()
    # Seed a private generator state so the caller's global RNG is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(cfg)
    return model.eval().to(device=device, dtype=spec.torch_dtype)


class _AllReduceOut(torch.nn.Module):
    """o_proj of a tensor-parallel rank: its partial product summed over the ranks."""

    def __init__(self, linear: torch.nn.Linear, all_reduce: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.linear = linear
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        self.all_reduce(y)
        return y


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """A rank's place in a tensor-parallel group and the group's sum."""

    world_size: int
    rank: int
    all_reduce: Callable[[torch.Tensor], None]

    def kv_heads(self, spec: ModelSpec) -> range:
        """The KV heads this rank holds."""
        n = spec.kv_heads // self.world_size
        return range(self.rank * n, (self.rank + 1) * n)


def shard_model(model: LlamaForCausalLM, spec: ModelSpec, tp: TensorParallel) -> None:
    """Cuts model down to tp's rank's share of every attention layer (in place)."""
    if tp.world_size < 1 or not 0 <= tp.rank < tp.world_size:
        raise ValueError("tensor parallel: rank %d of world size %d" % (tp.rank, tp.world_size))
    if spec.kv_heads % tp.world_size:
        raise ValueError("tensor parallel: %d KV heads do not split over %d ranks" % (spec.kv_heads, tp.world_size))
    if tp.world_size == 1:
        return
    d = spec.head_dim
    q_per = spec.heads // tp.world_size
    kv_per = spec.kv_heads // tp.world_size
    qs = slice(tp.rank * q_per * d, (tp.rank + 1) * q_per * d)
    kvs = slice(tp.rank * kv_per * d, (tp.rank + 1) * kv_per * d)
    for layer in model.model.layers:
        at = layer.self_attn
        with torch.no_grad():
            at.q_proj.weight = torch.nn.Parameter(at.q_proj.weight[qs].clone(), requires_grad=False)
            at.k_proj.weight = torch.nn.Parameter(at.k_proj.weight[kvs].clone(), requires_grad=False)
            at.v_proj.weight = torch.nn.Parameter(at.v_proj.weight[kvs].clone(), requires_grad=False)
            at.o_proj.weight = torch.nn.Parameter(at.o_proj.weight[:, qs].clone(), requires_grad=False)
        at.o_proj = _AllReduceOut(at.o_proj, tp.all_reduce)


def new_cache(model: LlamaForCausalLM) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_from_kv(model: LlamaForCausalLM, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache holding, per layer, K and V of shape (kv_heads, tokens, head_dim)."""
    cache = new_cache(model)
    for layer, (k, v) in enumerate(kv):
        cache.update(k.unsqueeze(0), v.unsqueeze(0), layer)
    return cache


def layer_kv(cache: DynamicCache, layer: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of tokens [start, end) in layer, each (kv_heads, end - start, head_dim)."""
    lay = cache.layers[layer]
    return lay.keys[0, :, start:end, :], lay.values[0, :, start:end, :]


@torch.no_grad()
def prefill(
    model: LlamaForCausalLM,
    cache: DynamicCache,
    tokens: list[int],
    start: int,
    chunk_tokens: int,
    on_chunk: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Computes tokens[start:] into cache (which holds tokens[:start]) in chunks that end on
    multiples of chunk_tokens, calling on_chunk(begin, end) after each; returns the logits of
    the last token (fp32, shape (vocab,))."""
    if start >= len(tokens):
        raise ValueError("prefill: nothing to compute (start %d of %d tokens)" % (start, len(tokens)))
    dev = model.device
    ids = torch.tensor(tokens, dtype=torch.long, device=dev)
    logits = None
    pos = start
    while pos < len(tokens):
        end = min(len(tokens), (pos // chunk_tokens + 1) * chunk_tokens)
        out = model(input_ids=ids[pos:end].unsqueeze(0), past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
        if on_chunk is not None:
            on_chunk(pos, end)
        pos = end
    assert logits is not None
    return logits.float()


@torch.no_grad()
def decode(
    model: LlamaForCausalLM, cache: DynamicCache, first_logits: torch.Tensor, n: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding of n tokens from the logits after the prompt: the tokens and each step's
    logits (the first is first_logits)."""
    toks: list[int] = []
    logits = [first_logits]
    cur = first_logits
    for i in range(n):
        t = int(torch.argmax(cur).item())
        toks.append(t)
        if i == n - 1:
            break
        out = model(
            input_ids=torch.tensor([[t]], dtype=torch.long, device=model.device), past_key_values=cache, use_cache=True
        )
        cur = out.logits[0, -1].float()
        logits.append(cur)
    return toks, logits


def check_tokens(spec: ModelSpec, tokens: list[int]) -> None:
    """Raises ValueError when a token id is outside the model's vocabulary or the prompt is
    longer than its positions."""
    if not tokens:
        raise ValueError("prompt: no tokens")
    bad = [t for t in tokens if not 0 <= t < spec.vocab]
    if bad:
        raise ValueError(
            "prompt: token %d at position %d is outside the vocabulary [0, %d) (raise --vocab)"
            % (bad[0], tokens.index(bad[0]), spec.vocab)
        )
    if len(tokens) > spec.max_positions:
        raise ValueError("prompt: %d tokens, more than the model's %d positions" % (len(tokens), spec.max_positions))
