"""The inference model (prefill/decoder.py): KV-cache decoding equals the cache-free reference,
weights depend only on the seed, and the config refuses bad values by name."""

from __future__ import annotations

import random

import pytest
import torch

from prefill.decoder import (InferenceConfig, build_model, generate_from_cache, greedy_generate,
                           prefill, prefill_chunk)

pytestmark = pytest.mark.unit

CFG = InferenceConfig()


@pytest.fixture(scope="module")
def model():
    return build_model(CFG)


@pytest.mark.parametrize("prompt_len,max_new", [(1, 24), (2, 5), (17, 24), (100, 16),
                                                (CFG.context - 5, 24), (CFG.context, 8)])
def test_cache_decoding_equals_reference(model, prompt_len, max_new):
    rng = random.Random(prompt_len)
    for _ in range(3):
        prompt = [rng.randrange(CFG.vocab_size) for _ in range(prompt_len)]
        kv, first = prefill(model, prompt)
        assert list(kv.shape) == CFG.kv_shape(prompt_len) and kv.dtype == torch.float32
        got = generate_from_cache(model, kv, first, max_new)
        want = greedy_generate(model, prompt, max_new)
        assert got == want, f"prompt {prompt}"
        # the context rule: the last token out is never fed back
        assert len(got) == min(max_new, CFG.context - prompt_len + 1)
        assert got[0] == first


def test_prefill_refuses_bad_prompts(model):
    with pytest.raises(ValueError, match="prompt: empty"):
        prefill(model, [])
    with pytest.raises(ValueError, match="context is 256"):
        prefill(model, [1] * 257)
    with pytest.raises(ValueError, match=r"prompt\[1\]"):
        prefill(model, [1, 256])
    with pytest.raises(ValueError, match="kv: shape"):
        generate_from_cache(model, torch.zeros(2, 2, 4, 3, 8), 0, 4)


def test_weights_depend_only_on_the_seed():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = build_model(CFG), build_model(CFG)
    assert torch.equal(torch.random.get_rng_state(), state)   # the caller's RNG untouched
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    c = build_model(InferenceConfig(seed=1))
    assert not torch.equal(a.wte.weight, c.wte.weight)
    assert not a.training


def test_config_round_trip_and_validation():
    cfg = InferenceConfig(n_layer=3, n_embd=32, n_head=2, vocab_size=100, context=64, seed=7)
    assert InferenceConfig.from_dict(cfg.to_dict()) == cfg
    assert InferenceConfig.from_dict({}) == InferenceConfig()
    assert cfg.head_dim == 16 and cfg.kv_shape(5) == [3, 2, 2, 5, 16]
    for bad, field in [({"n_embd": 65}, "n_embd"), ({"n_layer": 0}, "n_layer"),
                       ({"n_head": True}, "n_head"), ({"context": "256"}, "context"),
                       ({"vocab_size": 1}, "vocab_size"), ({"seed": -1}, "seed"),
                       ({"layers": 2}, "layers")]:
        with pytest.raises(ValueError, match=rf"^model\.{field}: "):
            InferenceConfig.from_dict(bad)
    with pytest.raises(ValueError, match="expected a mapping"):
        InferenceConfig.from_dict([1])


@pytest.mark.parametrize("cuts", [[1], [10, 11], [50, 100, 200], [CFG.context - 1]])
def test_chunked_prefill_equals_one_prefill(model, cuts):
    """Chunks that continue the cached prefix give one prefill's cache and first token, and
    decoding from that cache gives the reference's tokens."""
    rng = random.Random(len(cuts))
    prompt = [rng.randrange(CFG.vocab_size) for _ in range(CFG.context)]
    kv_all, first_all = prefill(model, prompt)
    kv = None
    for a, b in zip([0] + cuts, cuts + [len(prompt)]):
        kv, first = prefill_chunk(model, prompt[a:b], kv)
    assert kv.shape == kv_all.shape and torch.allclose(kv, kv_all, atol=1e-5)
    assert first == first_all
    short = prompt[:cuts[0] + 3]
    kv, first = prefill_chunk(model, short[cuts[0]:], prefill(model, short[:cuts[0]])[0])
    assert generate_from_cache(model, kv, first, 6) == greedy_generate(model, short, 6)
    with pytest.raises(ValueError, match="context"):
        prefill_chunk(model, [1, 2], kv_all)
