import pytest
import torch
import torch.nn.functional as F

from nmt.decoding.cpu_linear import OneDNNLinear, PackedWeight, linear, onednn_preferred, use_onednn
from nmt.decoding.search import beam_search, greedy
from tests.test_search import real_model, sources

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_equals_pytorchs(bias):
    g = torch.Generator().manual_seed(0)
    weight, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g) if bias else None
    for x in (torch.randn(7, 32, generator=g), torch.randn(3, 5, 32, generator=g),
              torch.randn(5, 3, 32, generator=g).transpose(0, 1), torch.randn(0, 32)):
        with torch.inference_mode():
            got = linear(x, weight, b)
        assert got.shape == F.linear(x, weight, b).shape
        torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_the_relu_in_the_gemms_pass_is_the_relu_after_it():
    g = torch.Generator().manual_seed(1)
    weight, b, x = torch.randn(48, 32, generator=g), torch.randn(48, generator=g), torch.randn(9, 32, generator=g)
    with torch.inference_mode():
        for packed in (None, PackedWeight()):
            assert torch.equal(linear(x, weight, b, packed, "relu"), linear(x, weight, b, packed).relu())
    ffn = use_onednn(real_model()).decoder[0].ffn
    assert ffn[0].post == "relu" and type(ffn[1]) is torch.nn.Identity and ffn[3].post == "none"


def test_onednn_linear_leaves_autograd_to_pytorch():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    linear(x, layer.weight, layer.bias).sum().backward()
    expected = torch.ones(3, 4) @ layer.weight
    torch.testing.assert_close(x.grad, expected)
    assert layer.weight.grad is not None


def test_onednn_linear_leaves_autocast_to_pytorch():
    weight, x = torch.randn(4, 8), torch.randn(3, 8)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, weight).dtype == torch.bfloat16


def test_use_onednn_keeps_parameters_and_translations():
    plain, src = real_model(), sources(4)
    swapped = use_onednn(real_model())
    assert all(type(m) is not torch.nn.Linear for m in swapped.modules())
    assert any(isinstance(m, OneDNNLinear) for m in swapped.modules())
    before, after = plain.state_dict(), swapped.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.inference_mode():
        torch.testing.assert_close(swapped(src, src), plain(src, src), rtol=1e-4, atol=1e-4)
    for search in (lambda m: beam_search(m, src, beam=4, alpha=0.6, max_extra=8),
                   lambda m: greedy(m, src, max_extra=8)):
        ours, theirs = search(swapped), search(plain)
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-4)


def test_onednn_is_preferred_only_off_intel(monkeypatch):
    import builtins
    import io

    from nmt.decoding import cpu_linear

    real_open = builtins.open
    for vendor, expected in (("GenuineIntel", False), ("AuthenticAMD", True)):
        cpu_linear.onednn_preferred.cache_clear()
        monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(f"vendor_id\t: {vendor}\n")
                            if path == "/proc/cpuinfo" else real_open(path, *a, **k))
        assert onednn_preferred() is expected
    monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "arm64")
    cpu_linear.onednn_preferred.cache_clear()
    assert onednn_preferred() is False
    monkeypatch.undo()
    cpu_linear.onednn_preferred.cache_clear()


def test_a_packed_weight_gives_the_same_bits_and_follows_the_weight():
    g = torch.Generator().manual_seed(1)
    weight, bias, packed = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), PackedWeight()
    with torch.inference_mode():
        for rows in (1, 2, 5, 40, 300):
            for x in (torch.randn(rows, 64, generator=g), torch.randn(rows, 3, 64, generator=g)):
                assert torch.equal(linear(x, weight, bias, packed), linear(x, weight, bias))
        weight.mul_(2)  # a changed weight (an optimizer step) is packed again, not read stale
        x = torch.randn(7, 64, generator=g)
        assert torch.equal(linear(x, weight, bias, packed), linear(x, weight, bias))


def test_use_onednn_packs_the_weights_once():
    model = use_onednn(real_model())
    src = sources(4)
    with torch.inference_mode():
        beam_search(model, src, beam=4, alpha=0.6, max_extra=8)
        packed = {id(m.packed.packed) for m in model.modules() if isinstance(m, OneDNNLinear)}
        beam_search(model, src, beam=4, alpha=0.6, max_extra=8)
        assert {id(m.packed.packed) for m in model.modules() if isinstance(m, OneDNNLinear)} == packed
        assert model.output_linear.packed.packed is not None
