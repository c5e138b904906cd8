"""The causal encoder-decoder (CED) split of an attention model (levers-mixers §4).

The bottom E layers become a causal encoder that runs only at prefill; the D = L − E decoder
layers get their K and V projected from the last encoder state, and the last W prompt tokens
are replayed through the decoder (on the prefill pool, or on the decode pool in a mixed step
that emits the first token there). Decode always runs the whole model, so KV bytes per token
and decode capacity are the model's own. Every count is an exact integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kvcargo.catalog import Model
from kvcargo.cost import attention_params, shape


def is_ced(model: Model) -> bool:
    return model.ced_encoder_layers > 0


def replay_on_decode(model: Model) -> bool:
    """Whether the decode pool runs the replay (and stamps the first token)."""
    return is_ced(model) and model.ced_replay_on == "decode"


@dataclass(frozen=True)
class Split:
    """Parameter counts of a CED split (levers-mixers §4.2)."""

    encoder: int
    decoder: int
    p_att: int
    """Parameters of one layer (attention + MLP)."""
    p_kvp: int
    """Decoder K/V projections applied to the last encoder state: D · 2 · d · kv."""
    p_prompt: int
    """Matmul parameters a prompt token touches: E · P_att + P_kvp."""
    p_enc_res: int
    """Resident on an encoder-only prefill instance: P_prompt + V · d (embedding)."""


@cache
def split(model: Model) -> Split:
    E = model.ced_encoder_layers
    D = model.layers - E
    d = model.d_model
    p_att = attention_params(model) + 3 * d * model.d_ff
    p_kvp = D * 2 * d * model.kv_heads * model.head_dim
    p_prompt = E * p_att + p_kvp
    return Split(E, D, p_att, p_kvp, p_prompt, p_prompt + model.vocab * d)


def replay_attention(layers: int, d: int, prompt: int, w: int) -> int:
    """A(ℓ, s, w) = 2·ℓ·d·w·(2s − w + 1): causal attention of the last w of s positions."""
    return 2 * layers * d * w * (2 * prompt - w + 1)


def replay_length(model: Model, prompt: int) -> int:
    return min(prompt, model.ced_replay)


def encoder_resident_bytes(model: Model) -> float:
    """Weight bytes an encoder-only prefill instance holds (replay on decode)."""
    return split(model).p_enc_res * model.weight_bytes


def prefill_flops_bytes(model: Model, prompts: list[int], lm_head: str = "all",
                        encoder_only: bool = False) -> tuple[int, float]:
    """FLOPs and bytes of one CED prefill step (levers-mixers §4.3)."""
    sp, s = split(model), shape(model)
    d = model.d_model
    T = sum(prompts)
    flops = 2 * sp.p_prompt * T + sum(2 * sp.encoder * d * p * (p + 1) for p in prompts)
    kv = T * s.kv_per_token
    if encoder_only:
        return flops, sp.p_prompt * model.weight_bytes + T * s.row_bytes + kv
    w = [replay_length(model, p) for p in prompts]
    rt = sum(w)
    flops += 2 * sp.decoder * sp.p_att * rt + sum(replay_attention(sp.decoder, d, p, x) for p, x in zip(prompts, w))
    flops += 2 * model.vocab * d * (rt if lm_head == "all" else len(prompts))
    return flops, s.w_str + T * s.row_bytes + kv


def mixed_step_flops_bytes(model: Model, batch: int, context: int, replays: list[int],
                           lm_head: str = "all") -> tuple[int, float]:
    """FLOPs and bytes of a decode step with replay rows (levers-mixers §4.6): ``batch`` decode
    rows over ``context`` cached tokens, plus the replays of the given prompts."""
    s = shape(model)
    d, L = model.d_model, model.layers
    w = [replay_length(model, p) for p in replays]
    rt = sum(w)
    flops = (2 * s.p_mm * batch + 4 * L * d * (context + batch) + 2 * s.p_layers * rt
             + 2 * model.vocab * d * (rt if lm_head == "all" else len(replays))
             + sum(replay_attention(L, d, p, x) for p, x in zip(replays, w)))
    nbytes = s.w_str + (batch + rt) * s.row_bytes + (context + batch) * s.kv_per_token + sum(replays) * s.kv_per_token
    return flops, nbytes
