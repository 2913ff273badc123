"""The PyTorch peer's dropouts and epoch loop (tflm/testing/reference_peer.py), which
bench/reproductions/parity.py trains side by side with zoo.train: each dropout where and how the
references draw it, checked statistically, and main.py's evaluate() with the ASGD averages."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tflm.testing.reference_peer import ReferenceLoop, ReferenceRNNModel, batchify  # noqa: E402

V, E, H = 30, 6, 8


def _peer(**dropouts):
    torch.manual_seed(0)
    return ReferenceRNNModel(V, E, H, E, 3, **dropouts)


def test_locked_dropout_is_one_mask_per_stream_shared_over_time():
    peer = _peer().train()
    x = torch.ones(40, 64, 50)
    y = peer._locked_dropout(x, 0.4)
    assert torch.equal(y, y[:1].expand_as(y))  # constant over time
    np.testing.assert_allclose(np.unique(y.numpy()), [0.0, 1 / 0.6], rtol=1e-6)
    assert abs(float((y[0] == 0).float().mean()) - 0.4) < 0.03  # 3200 draws: sd ~0.009
    assert torch.equal(peer.eval()._locked_dropout(x, 0.4), x)


def test_embedding_dropout_drops_whole_rows():
    peer = _peer(dropoute=0.5).train()
    tokens = torch.arange(V).repeat(20, 1)  # every word at 20 positions
    emb = peer._embed(tokens)
    weight = peer.encoder.weight.detach()
    dropped = (emb == 0).all(-1)
    assert torch.equal(dropped, dropped[:1].expand_as(dropped))  # a word is dropped everywhere
    kept = ~dropped[0]
    np.testing.assert_allclose(emb[0, kept].detach().numpy(), 2 * weight[kept].numpy(),
                               rtol=1e-6)
    assert 0 < int(dropped[0].sum()) < V


def test_weight_drop_draws_a_new_recurrent_mask_per_forward_and_leaves_the_weight():
    peer = _peer(wdrop=0.5)
    tokens = torch.randint(0, V, (5, 4), generator=torch.Generator().manual_seed(1))
    stored = peer.rnns[0].weight_hh_l0.detach().clone()
    peer.train()
    first, _, _ = peer(tokens, peer.init_hidden(4))
    second, _, _ = peer(tokens, peer.init_hidden(4))
    assert not torch.allclose(first, second)
    assert torch.equal(peer.rnns[0].weight_hh_l0, stored)
    peer.eval()
    plain = _peer().eval()
    with torch.no_grad():
        np.testing.assert_allclose(peer(tokens, peer.init_hidden(4))[0].numpy(),
                                   plain(tokens, plain.init_hidden(4))[0].numpy(), atol=1e-6)


def test_epoch_then_averaged_evaluation_restores_the_raw_weights():
    peer = _peer(dropout=0.2, dropouth=0.2, dropouti=0.2, dropoute=0.1, wdrop=0.3)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, 1200)
    loop = ReferenceLoop(peer, 10.0, 8)
    before = loop.evaluate(batchify(ids[:300], 5), 5)
    loop.train_epoch(batchify(ids, 4), rng, max_seq_len=10)
    loop.switch_to_asgd()
    loop.train_epoch(batchify(ids, 4), rng, max_seq_len=10)
    raw = {n: p.detach().clone() for n, p in peer.named_parameters()}
    averaged = loop.evaluate(batchify(ids[:300], 5), 5)
    for n, p in peer.named_parameters():
        assert torch.equal(p, raw[n]), n
    with torch.no_grad():
        for p in peer.parameters():
            p.copy_(loop.optimizer.state[p]["ax"])
    loop.optimizer = torch.optim.SGD(peer.parameters(), lr=1.0)  # evaluate as it stands
    assert loop.evaluate(batchify(ids[:300], 5), 5) == pytest.approx(averaged, rel=1e-6)
    assert np.isfinite(before) and averaged != before
