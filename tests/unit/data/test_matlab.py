"""MATLAB fidelity: the matlab_seed preset's settings, each checked numerically, and .mat files
in every supported layout and version loading to the same tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import ROOT
from harness.inprocess import run_script
from harness.matfiles import MatCell, write_v5, write_v73
from hydra.utils import instantiate

from seqlab import SeqlabError
from seqlab.data import load_mat, load_npz, synthetic_daily_load
from seqlab.model import CNNLSTM
from seqlab.training.evaluation import population_bn_statistics_
from seqlab.training.gradients import GradientTreatment, clip_, l2_parameters


def test_the_default_experiment_keeps_pytorch_behaviour(compose_cfg):
    cfg = compose_cfg()
    m = cfg.module
    assert (m.l2_regularization, m.gradient_threshold, m.bn_statistics) == (0.0, None, "moving")
    assert cfg.model.init == "pytorch" and not cfg.data.drop_last


def test_preset_learning_rate_per_epoch(compose_cfg):
    cfg = compose_cfg("experiment=matlab_seed")
    optimizer = instantiate(cfg.optimizer)(params=[torch.nn.Parameter(torch.zeros(1))])
    scheduler = instantiate(cfg.scheduler)(optimizer=optimizer)
    lr_of_epoch = {}
    for epoch in range(1, 201):
        lr_of_epoch[epoch] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()  # stepped once per epoch, as the module configures it
    assert all(lr_of_epoch[e] == pytest.approx(1e-3) for e in range(1, 97))
    assert all(lr_of_epoch[e] == pytest.approx(2.5e-4) for e in range(97, 193))
    assert all(lr_of_epoch[e] == pytest.approx(6.25e-5) for e in range(193, 201))


# -- initialisation ------------------------------------------------------------------------------


def test_matlab_initial_weights_match_the_formulas_per_layer():
    conv, ih, hh, fc = [], [], [], []
    for seed in range(20):
        torch.manual_seed(seed)
        m = CNNLSTM(n_features=1440, init="matlab")
        conv.append(m.conv.weight.flatten())
        ih.append(m.lstm.weight_ih_l0.flatten())
        hh.append(m.lstm.weight_hh_l0.flatten())
        fc.append(m.fc.weight.flatten())
        assert torch.count_nonzero(m.conv.bias) == 0 and torch.count_nonzero(m.fc.bias) == 0
        assert torch.count_nonzero(m.lstm.bias_hh_l0) == 0
        gates = m.lstm.bias_ih_l0.view(4, 24)  # i, f, g, o
        assert torch.all(gates[1] == 1) and torch.count_nonzero(gates[[0, 2, 3]]) == 0
        assert torch.all(m.fc.weight.abs() <= math.sqrt(6 / (24 + 1)))
    conv, ih, hh, fc = (torch.cat(v) for v in (conv, ih, hh, fc))
    # He: N(0, 2/numIn), numIn = filter size x channels for the convolution (5 x 1440)
    assert conv.mean().item() == pytest.approx(0, abs=0.003)
    assert conv.std().item() == pytest.approx(math.sqrt(2 / 7200), rel=0.02)
    assert ih.std().item() == pytest.approx(math.sqrt(2 / 2), rel=0.05)  # InputSize = 2 filters
    assert hh.std().item() == pytest.approx(math.sqrt(2 / 24), rel=0.03)
    # Glorot uniform U(-a, a), a = sqrt(6 / (in + out)): variance a^2 / 3 = 2 / (in + out)
    assert fc.std().item() == pytest.approx(math.sqrt(2 / 25), rel=0.1)


# -- gradients: L2 and thresholds ----------------------------------------------------------------


def _model_with_grads(seed=0, scale=1.0):
    torch.manual_seed(seed)
    m = CNNLSTM(n_features=16, init="matlab")
    for p in m.parameters():
        p.grad = scale * torch.randn_like(p)
    return m


def test_l2_reaches_weights_and_batchnorm_scale_offset_but_not_biases():
    m = _model_with_grads()
    for p in m.parameters():
        p.grad.zero_()
    GradientTreatment(m, l2_regularization=0.1)()
    with_l2 = {
        "conv.weight",
        "bn.weight",
        "bn.bias",
        "lstm.weight_ih_l0",
        "lstm.weight_hh_l0",
        "fc.weight",
    }
    for name, p in m.named_parameters():
        expected = 0.1 * p.detach() if name in with_l2 else torch.zeros_like(p)
        torch.testing.assert_close(p.grad, expected, msg=name)
    assert {id(p) for p in l2_parameters(m)} == {
        id(p) for n, p in m.named_parameters() if n in with_l2
    }


def test_per_tensor_clipping_changes_only_tensors_over_the_threshold():
    m = _model_with_grads(scale=0.05)
    m.conv.weight.grad.mul_(100)  # this one far over the threshold
    before = {n: p.grad.clone() for n, p in m.named_parameters()}
    clip_(list(m.parameters()), threshold=1.0, method="l2norm")
    for name, p in m.named_parameters():
        norm = before[name].norm()
        if norm > 1.0:
            assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-5), name
            torch.testing.assert_close(p.grad, before[name] / norm)  # same direction
        else:
            assert torch.equal(p.grad, before[name]), name
    assert before["conv.weight"].norm() > 1 and sum(before[n].norm() <= 1 for n in before) >= 5


def test_global_and_absolute_value_thresholds():
    m = _model_with_grads()
    before = [p.grad.clone() for p in m.parameters()]
    total = torch.sqrt(sum(g.pow(2).sum() for g in before))
    clip_(list(m.parameters()), threshold=1.0, method="global-l2norm")
    for p, g in zip(m.parameters(), before):
        torch.testing.assert_close(p.grad, g / total)
    m = _model_with_grads()
    before = [p.grad.clone() for p in m.parameters()]
    clip_(list(m.parameters()), threshold=0.5, method="absolute-value")
    for p, g in zip(m.parameters(), before):
        torch.testing.assert_close(p.grad, g.clamp(-0.5, 0.5))


def test_l2_is_added_before_the_threshold():
    m = _model_with_grads()
    for p in m.parameters():
        p.grad.zero_()
    GradientTreatment(m, l2_regularization=1000.0, threshold=1.0)()
    assert m.fc.weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)  # L2 term, then clipped
    assert torch.count_nonzero(m.fc.bias.grad) == 0


def test_lightning_applies_l2_then_the_threshold_before_each_step(compose_cfg):
    """One real Lightning step equals a hand-written MATLAB iteration: loss, backward, L2 added,
    per-tensor threshold, Adam."""
    import copy
    from functools import partial

    import pytorch_lightning as pl

    from seqlab.data import TensorBatches
    from seqlab.packing.data import PackData
    from seqlab.packing.members import Member
    from seqlab.packing.model import OneMember
    from seqlab.packing.optim import build_update
    from seqlab.tracking.steps import StepLog
    from seqlab.training.evaluation import half_mse

    cfg = compose_cfg("experiment=matlab_seed")
    torch.manual_seed(0)
    model = CNNLSTM(n_features=1440, init="matlab", dropout=0.0)
    reference = copy.deepcopy(model)
    data = synthetic_daily_load(64, seed=0)
    x, y = (
        torch.from_numpy(data.x),
        50 * torch.from_numpy(data.y),
    )  # large errors: thresholds engage

    # The job's module as a run alone's (seqlab.train), in Lightning's automatic optimisation.
    member = Member(0, cfg, job=None, tracker=None, network=model)
    data = PackData(x[:, 0], y, None, torch.arange(64)[None], None, 64, 1, False)
    update = partial(
        build_update,
        networks=[model],
        optimizers=[instantiate(cfg.optimizer)],
        scheduler=None,
    )
    module = instantiate(cfg.module)(
        model=OneMember(model),
        members=[member],
        data=data,
        update=update,
        step_log=StepLog(),
        batches=lambda: TensorBatches(x, y, 64, False, False, 0),
    )
    trainer = pl.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(module)

    params = [p for p in reference.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    half_mse(reference(x), y).backward()
    with torch.no_grad():
        for p in l2_parameters(reference):
            p.grad += 1e-4 * p
        clipped = 0
        for p in params:
            norm = p.grad.norm()
            if norm > 1.0:
                p.grad *= 1.0 / norm
                clipped += 1
    optimizer.step()
    assert clipped >= 2  # the threshold really acted
    for (name, a), b in zip(module.model.net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, msg=name)
    assert torch.count_nonzero(module.model.net.lstm.bias_hh_l0) == 0  # MATLAB's single bias


# -- data handling -------------------------------------------------------------------------------


def test_the_last_partial_batch_is_dropped(compose_cfg):
    cfg = compose_cfg("experiment=matlab_seed", "data.n_samples=200")
    dm = instantiate(cfg.data)
    dm.setup()
    assert len(dm.train) == 200  # no validation split in the preset
    batches = dm.train_dataloader()
    assert len(batches) == 3 and [len(b[0]) for b in batches] == [64, 64, 64]


def test_population_statistics_are_those_of_the_whole_training_set():
    torch.manual_seed(0)
    model = CNNLSTM(n_features=16)
    x = torch.randn(50, 3, 16) * 2 + 1
    batches = [(x[i : i + 16], torch.zeros(len(x[i : i + 16]), 1)) for i in range(0, 50, 16)]
    population_bn_statistics_(model, batches, torch.device("cpu"))
    with torch.no_grad():
        h = model.conv(x.transpose(1, 2)).double()  # (N, filters, steps)
    torch.testing.assert_close(model.bn.running_mean, h.mean((0, 2)).float())
    torch.testing.assert_close(model.bn.running_var, h.var((0, 2), unbiased=True).float())
    assert model.training  # mode restored


def test_last_output_of_a_padded_sequence_is_its_last_real_step():
    torch.manual_seed(0)
    model = CNNLSTM(n_features=8, kernel_size=1).eval()  # kernel 1: no conv reach into padding
    short, long = torch.randn(1, 2, 8), torch.randn(1, 5, 8)
    padded = torch.cat([torch.nn.functional.pad(short, (0, 0, 0, 3)), long])
    out = model(padded, torch.tensor([2, 5]))
    torch.testing.assert_close(out[0], model(short)[0])
    torch.testing.assert_close(out[1], model(long)[0])


# -- .mat files ----------------------------------------------------------------------------------

N, C = 6, 1440
RNG = np.random.default_rng(7)
DAYS = RNG.normal(size=(N, 3, C))  # sample, step, feature
Y = RNG.normal(size=(N, 1))

LAYOUTS = {
    # an N-by-1 cell array of 1440x1x1xS arrays (sequenceInputLayer([1440 1 1]))
    "cell_1440x1x1xS": lambda: MatCell([DAYS[i].T.reshape(C, 1, 1, 3) for i in range(N)]),
    # an N-by-1 cell array of 1440xS arrays
    "cell_1440xS": lambda: MatCell([DAYS[i].T for i in range(N)]),
    # a 1-by-N cell array
    "cell_row": lambda: MatCell([DAYS[i].T for i in range(N)], shape=(1, N)),
}


@pytest.mark.parametrize("writer", [write_v5, write_v73], ids=["v5", "v7.3"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cell_layouts_in_both_versions_load_to_the_same_tensors(tmp_path, writer, layout):
    path = tmp_path / "data.mat"
    writer(path, {"XrTrain": LAYOUTS[layout](), "YrTrain": Y})
    data = load_mat(str(path), None, 0)
    assert data.x.shape == (N, 3, C) and data.lengths is None
    np.testing.assert_allclose(data.x, DAYS.astype(np.float32))
    np.testing.assert_allclose(data.y, Y.astype(np.float32))


@pytest.mark.parametrize("writer", [write_v5, write_v73], ids=["v5", "v7.3"])
@pytest.mark.parametrize("transpose", [False, True], ids=["N x 1440", "1440 x N"])
def test_numeric_matrices_load_as_one_step(tmp_path, writer, transpose):
    path = tmp_path / "data.mat"
    days = DAYS[:, 0, :]
    writer(
        path, {"XrTrain": days.T if transpose else days, "YrTrain": Y.T}
    )  # a row vector of responses too
    data = load_mat(str(path), None, 0)
    assert data.x.shape == (N, 1, C)
    np.testing.assert_allclose(data.x[:, 0], days.astype(np.float32))
    np.testing.assert_allclose(data.y, Y.astype(np.float32))


@pytest.mark.parametrize("writer", [write_v5, write_v73], ids=["v5", "v7.3"])
def test_ragged_cells_are_padded_right_and_validation_is_read(tmp_path, writer, caplog):
    path = tmp_path / "data.mat"
    lengths = [3, 1, 2, 3, 2, 1]
    cells = MatCell([DAYS[i, : lengths[i]].T.reshape(C, 1, 1, lengths[i]) for i in range(N)])
    writer(
        path,
        {
            "XrTrain": cells,
            "YrTrain": Y,
            "XrVal": MatCell([DAYS[i].T for i in range(2)]),
            "YrVal": Y[:2],
        },
    )
    with caplog.at_level("INFO", logger="seqlab"):
        data = load_mat(str(path), None, 0)
    np.testing.assert_array_equal(data.lengths, lengths)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(data.x[i, :n], DAYS[i, :n].astype(np.float32))
        assert np.all(data.x[i, n:] == 0)
    assert data.val.x.shape == (2, 3, C) and data.val.lengths is None
    assert (
        "XrTrain = 6x1 cell array of 1440x1x1x3 ... arrays -> N=6, 1440 feature(s), steps 1..3 (padded right)"
        in caplog.text
    )


@pytest.mark.parametrize(
    "variables, message",
    [
        (
            {"X": np.ones((3, 4)), "YrTrain": Y},
            r"no variable XrTrain \(found: X \(3x4\), YrTrain \(6x1\)\); set data.x_key",
        ),
        (
            {"XrTrain": MatCell([np.ones((C, 1))] * 6, shape=(3, 2)), "YrTrain": Y},
            r"XrTrain is a 3x2 cell array; expected an N-by-1 cell array of C-by-S or 1440x1x1xS arrays",
        ),
        (
            {"XrTrain": np.ones((5, 7)), "YrTrain": Y},
            r"XrTrain is a 5x7 array; expected .* with N=6 as in the responses",
        ),
        (
            {"XrTrain": np.ones((6, 7)), "YrTrain": MatCell([np.ones((1, 1))] * 6)},
            r"YrTrain is a 6x1 cell array; expected a numeric N-by-1 vector or N-by-R matrix",
        ),
    ],
    ids=["missing", "cell-shape", "matrix-shape", "cell-responses"],
)
def test_a_malformed_file_names_the_variable_and_the_expected_shape(tmp_path, variables, message):
    path = tmp_path / "bad.mat"
    write_v5(path, variables)
    with pytest.raises(SeqlabError, match=message):
        load_mat(str(path), None, 0)


def test_not_a_mat_file(tmp_path):
    path = tmp_path / "notes.mat"
    path.write_text("these are not numbers")
    with pytest.raises(SeqlabError, match="not a MATLAB .mat file"):
        load_mat(str(path), None, 0)


def test_mat2npz_converts_to_the_same_tensors(tmp_path):
    mat, npz = tmp_path / "d.mat", tmp_path / "d.npz"
    cells = MatCell([DAYS[i, : 1 + i % 3].T for i in range(N)])
    write_v73(mat, {"XrTrain": cells, "YrTrain": Y, "XrVal": DAYS[:2, 0], "YrVal": Y[:2]})
    proc = run_script(ROOT / "scripts" / "mat2npz.py", [str(mat), str(npz)])
    assert proc.returncode == 0, proc.stderr
    a, b = load_mat(str(mat), None, 0), load_npz(str(npz), None, 0)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.val.x, b.val.x)
    bad = run_script(ROOT / "scripts" / "mat2npz.py", [str(mat), str(npz), "--x-key", "Nope"])
    assert (
        bad.returncode == 1
        and bad.stderr.startswith("error: ")
        and "no variable Nope" in bad.stderr
    )
