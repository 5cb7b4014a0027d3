"""`dmp.plan` and `dmp plan`: the planner's arithmetic on a program of known costs, its
probes of a real fit, and the command line."""

import json

import dask
import numpy as np
import pytest

import dmp
from conftest import make_problem
from dmp.cli import _workers_list, main
from dmp.io import write_sparse
from dmp.linear_model import Lasso
from dmp.linear_model._lasso_program import LassoProgram
from dmp.planning import (COUNT_FACTOR, EngineCosts, Network, NullProgram, Probe,
                          parse_network, predict, probe_program, throttled_seconds)

GBIT = 1e9 / 8


@pytest.mark.parametrize("text, bandwidth, latency", [
    ("10Gbit,50us", 10 * GBIT, 50e-6),
    ("1GB/s, 0.1ms", 1e9, 1e-4),
    ("100Mbit,1ms", 100e6 / 8, 1e-3),
    ("2.5GiB,200ns", 2.5 * 2**30, 200e-9),
])
def test_parse_network(text, bandwidth, latency):
    net = parse_network(text)
    assert net.bandwidth == pytest.approx(bandwidth, rel=1e-12)
    assert net.latency == pytest.approx(latency, rel=1e-12)


@pytest.mark.parametrize("text, says", [
    ("10Gbit", "a bandwidth and a latency"),
    ("10Gbits,50us", "cannot read the bandwidth '10gbits'"),
    ("fast,50us", "cannot read the bandwidth"),
    ("10Gbit,50", "cannot read the latency '50'"),
    ("0Gbit,50us", "bandwidth must be > 0"),
])
def test_parse_network_refuses(text, says):
    with pytest.raises(ValueError, match=says):
        parse_network(text)


def test_predict_arithmetic():
    """One round on P = 4 from a probe whose every cost is given; the expected figures are
    worked out here term by term."""
    probe = Probe(n_partitions=4, rounds=50, rounds_source="probe", max_rounds=100,
                  compute_s=0.02, driver_s=0.004, driver_bytes=4e6, ring_bytes=1e6,
                  ring_messages=1.0, batch_rounds=1.0)
    net = Network(bandwidth=1e9, latency=1e-4)
    eng = EngineCosts(call_s=1e-3, worker_call_s=2e-3, message_s=5e-4, round_s=3e-3,
                      ring_byte_s=1e-9)
    row = predict(probe, 4, network=net, engine=eng, cores_per_worker=0.5, driver_cores=2.0)
    compute = 0.02 / 0.5                                   # half a core: twice as long
    driver = 0.004 / 1.0                                   # more than a core: no faster
    comm = 4e6 / 1e9 + 2e-4 + 1e6 / 1e9 + 1e-4             # driver link, ring hop
    # calls; the hop and its 1e6 bytes on the worker's half core
    overhead = (4 * 1e-3 + 3e-3) / 1.0 + 2e-3 / 0.5 + (5e-4 + 1e6 * 1e-9) / 0.5
    round_s = compute + driver + comm + overhead           # 0.04 + 0.004 + 0.0053 + 0.014
    assert row["round_s"] == pytest.approx(0.0633, rel=1e-12)
    assert row["round_s"] == pytest.approx(round_s, rel=1e-12)
    assert row["loop_s"] == pytest.approx(50 * 0.0633, rel=1e-12)
    assert row["compute_s"] == pytest.approx(50 * 0.04, rel=1e-12)
    assert row["comm_s"] == pytest.approx(50 * 0.0053, rel=1e-12)
    assert row["overhead_s"] == pytest.approx(50 * 0.014, rel=1e-12)
    assert row["bytes_per_worker_round"] == pytest.approx(1e6 + 1e6)
    assert row["network_bytes"] == pytest.approx(50 * (4e6 + 4 * 1e6))
    # lead rounds of their own cost (LDA's counting rotation): 4 rounds of 0.001 s together
    lead = predict(Probe(**{**probe.__dict__, "lead_rounds": 4, "lead_compute_s": 0.001}), 4,
                   network=net, engine=eng, cores_per_worker=0.5, driver_cores=2.0)
    assert lead["compute_s"] == pytest.approx(0.001 / 0.5 + 46 * 0.04, rel=1e-12)
    assert lead["loop_s"] == pytest.approx(50 * 0.0633 - 4 * 0.04 + 0.002, rel=1e-12)
    # a fit shorter than its lead: that share of the lead's cost
    short = predict(Probe(**{**probe.__dict__, "rounds": 2, "lead_rounds": 4,
                             "lead_compute_s": 0.001}), 4, network=net, engine=eng,
                    cores_per_worker=0.5, driver_cores=2.0)
    assert short["compute_s"] == pytest.approx(0.001 / 0.5 / 2, rel=1e-12)


def _cfs_wall(cpu_s, cores, period, start, step=1e-6):
    """Wall seconds of ``cpu_s`` of work started at ``start`` (seconds into a CFS period, the
    quota unspent), stepped through time ``step`` by ``step``: runs while the period's quota
    lasts, waits for the next period once it is spent."""
    t, done, quota, end = 0.0, 0.0, cores * period, period - start
    while done < cpu_s - 1e-12:
        if t >= end - 1e-12:
            end, quota = end + period, cores * period
        if quota > 1e-12:
            run = min(step, quota, cpu_s - done, end - t)
            t, done, quota = t + run, done + run, quota - run
        else:
            t = end
    return t


@pytest.mark.parametrize("cpu_s", [0.0005, 0.002, 0.0021, 0.004, 0.013, 0.05])
@pytest.mark.parametrize("cores,period", [(0.2, 0.01), (0.5, 0.1), (0.05, 0.02)])
def test_throttled_seconds_is_the_cfs_quota_s_wall_time(cpu_s, cores, period):
    """Against a step-by-step walk through the periods, averaged over where the work
    starts; work within one quota is not slowed, long work approaches cpu_s / cores."""
    starts = (np.arange(64) + 0.5) / 64 * period
    walk = np.mean([_cfs_wall(cpu_s, cores, period, s, step=period / 2000) for s in starts])
    assert float(throttled_seconds(cpu_s, cores, period)) == pytest.approx(walk, rel=2e-3)
    if cpu_s <= cores * period:
        assert float(throttled_seconds(cpu_s, cores, period)) == pytest.approx(cpu_s)
    assert float(throttled_seconds(cpu_s, cores, None)) == pytest.approx(cpu_s / cores)
    assert float(throttled_seconds(cpu_s, 1.5, period)) == cpu_s


def test_predict_prices_each_round_on_a_cpu_quota():
    """With a quota's period, every probed round is throttled apart (short rounds within the
    quota at full speed, long ones nearly compute / cores); without one, the old
    mean / cores, whatever the samples."""
    rounds = (0.030, 0.001, 0.001, 0.002, 0.020)      # one lead round, then four
    probe = Probe(n_partitions=2, rounds=9, rounds_source="probe", max_rounds=100,
                  compute_s=float(np.mean(rounds[1:])), driver_s=0.0, driver_bytes=0.0,
                  lead_rounds=1, lead_compute_s=0.030, round_compute_s=rounds)
    net = Network(bandwidth=1e12, latency=0.0)
    eng = EngineCosts(call_s=0.0, worker_call_s=0.0, message_s=0.0, round_s=0.0)
    row = predict(probe, 2, network=net, engine=eng, cores_per_worker=0.2, cpu_period=0.01)
    wall = [float(throttled_seconds(c, 0.2, 0.01)) for c in rounds]
    assert wall[1] == pytest.approx(0.001) and wall[4] > 0.08
    assert row["compute_s"] == pytest.approx(wall[0] + 8 * np.mean(wall[1:]), rel=1e-12)
    slowed = predict(probe, 2, network=net, engine=eng, cores_per_worker=0.2)
    assert slowed["compute_s"] == pytest.approx((0.030 + 8 * np.mean(rounds[1:])) / 0.2,
                                                rel=1e-12)
    # a probe without its rounds (an extrapolated one whose lead differs): its means
    bare = Probe(**{**probe.__dict__, "round_compute_s": ()})
    row = predict(bare, 2, network=net, engine=eng, cores_per_worker=0.2, cpu_period=0.01)
    assert row["compute_s"] == pytest.approx(
        float(throttled_seconds(0.030, 0.2, 0.01))
        + 8 * float(throttled_seconds(np.mean(rounds[1:]), 0.2, 0.01)), rel=1e-12)


def test_predict_batches_spread_the_call_cost():
    """A call that runs many rounds (batch_rounds) pays the driver's round trip once: the
    runner sizes it to about ``dmp.batch.target-duration`` of work."""
    probe = Probe(n_partitions=2, rounds=1000, rounds_source="probe", max_rounds=1000,
                  compute_s=0.001, driver_s=0.0, driver_bytes=0.0, batch_rounds=500.0)
    net = Network(bandwidth=1e9, latency=1e-3)
    eng = EngineCosts(call_s=0.01, worker_call_s=0.0, message_s=0.0, round_s=0.0)
    row = predict(probe, 2, network=net, engine=eng, batch_target_s=0.1, batch_max_rounds=1024)
    assert row["rounds_per_call"] == pytest.approx(100.0)   # 0.1 s / 1 ms
    assert row["round_s"] == pytest.approx(0.001 + 2e-3 / 100 + 2 * 0.01 / 100, rel=1e-12)
    capped = predict(probe, 2, network=net, engine=eng, batch_target_s=10.0,
                     batch_max_rounds=1024)
    assert capped["rounds_per_call"] == pytest.approx(500.0)   # the program's bound


def test_probe_of_a_program_of_known_costs():
    """The probe reads the bytes and rounds of `NullProgram` exactly, its push time from
    the spin it does (at least what it spun on its thread)."""
    prog = NullProgram(push_s=0.004, partial_bytes=800, ring_bytes=1600, partition_bytes=12345)
    probe = probe_program(prog, 3, max_iter=12, seconds=30.0)
    assert probe.rounds == 12 and probe.rounds_source == "probe"
    # per partition: a plan (type + round: 16 bytes), a partial (type + 800); no pull result
    assert probe.driver_bytes == 3 * (16 + 8 + 800)
    assert probe.ring_bytes == 1600 and probe.ring_messages == 1.0
    assert probe.partition_bytes == 12345
    assert 0.0035 <= probe.compute_s < 0.5   # seconds of one core: what it spun
    assert probe.batch_rounds == 1.0
    row = predict(probe, 3, network=Network(1e9, 0.0), engine=EngineCosts(0, 0, 0, 0))
    assert probe.lead_rounds == 1 and probe.lead_compute_s >= 0.0035
    assert row["compute_s"] == pytest.approx(probe.lead_compute_s + 11 * probe.compute_s)
    assert row["bytes_per_worker_round"] == pytest.approx(16 + 8 + 800 + 1600)


def test_probe_leaves_the_ring_hand_over_to_the_workers(monkeypatch):
    """In process the partitions hand their ring messages over in the probe's thread; on a
    cluster each worker does (priced as the engine's message costs), so the probe's driver
    share leaves that time out: a hand-over slowed by 3 ms of CPU a message does not move
    it, nor the compute."""
    from dmp.engine.worker import PartitionWorker
    from dmp.planning import _spin

    send_all = PartitionWorker._send_all

    def slow_send_all(self, round, messages):
        _spin(0.003 * len(messages))
        return send_all(self, round, messages)

    monkeypatch.setattr(PartitionWorker, "_send_all", slow_send_all)
    prog = NullProgram(push_s=0.001, ring_bytes=800, fanout=True)
    probe = probe_program(prog, 3, max_iter=10, seconds=30.0)
    assert probe.ring_messages == 2.0
    assert 0.001 <= probe.compute_s < 0.004
    assert probe.driver_s < 0.002      # 0.018 s a round with the hand-over counted


def test_probe_of_ccdpp_pulls_what_a_clusters_driver_pulls():
    """A probe runs CCD++'s rounds in batches, as the Dask backend does: the driver's
    partials of a batch's inner rounds hold partition 0's score, not every partition's item
    sums, and the probe's bytes through the driver are those."""
    from dmp.decomposition import MatrixFactorization
    from dmp.planning import probe_estimator
    from mf_reference import low_rank_ratings

    tr, _ = low_rank_ratings(n=60, m=400, k=3, density=0.3, seed=7)
    est = MatrixFactorization(8, method="ccd++", max_iter=2, tol=None, random_state=0)
    # batches grow 4x at a time up to the program's bound, however slow the first rounds
    with dask.config.set({"dmp.batch.target-duration": "1h"}):
        probe = probe_estimator(est, tr, n_partitions=3, seconds=30.0)
    assert probe.rounds == probe.probed_rounds == 17 and probe.batch_rounds > 1
    # a round pulled whole brings the driver 3 partitions x 2 sums of 400 float64 at least;
    # the probe's mean, over batches of up to 8 rounds, is far below
    assert probe.driver_bytes < 3 * 2 * 400 * 8 / 4


def test_parmac_probe_runs_to_its_stopping_rule():
    """ParMAC's fit ends at its stopping rule long before its round budget (which grows with
    P): a short probe runs on to that rule (`Program.probe_to_stopping_rule`) and prices the
    fit's own rounds, not the budget."""
    from dmp.hashing import BinaryAutoencoder
    from dmp.planning import probe_estimator

    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 16)) + rng.integers(0, 4, (3000, 1))
    fit = BinaryAutoencoder(n_bits=8, random_state=0, backend="local", n_workers=3).fit(X)
    rounds = len(fit.round_history_["round"])
    probe = probe_estimator(BinaryAutoencoder(n_bits=8, random_state=0), X, n_partitions=3,
                            seconds=0.1)
    assert probe.rounds_source == "probe"
    assert probe.rounds == probe.probed_rounds == rounds < probe.max_rounds


def test_probe_prices_lead_rounds_apart():
    """A program whose first 4 rounds (`Program.lead_rounds`) cost 10x less than the rest
    (as LDA's counting rotation): the probe runs past them even when its time is up, and
    the prediction is the lead as measured plus the later rounds at their own mean, not
    every round at a mean that mixes both."""
    prog = NullProgram(push_s=0.01, lead_rounds=4, lead_push_s=0.001)
    probe = probe_program(prog, 2, max_iter=20, seconds=0.001)
    assert probe.rounds_source == "max_iter" and probe.probed_rounds == 6
    assert probe.lead_rounds == 4
    # seconds of one core: at least what was spun; the later rounds' mean from them alone
    assert 0.004 <= probe.lead_compute_s < 0.03
    assert 0.01 <= probe.compute_s < 0.02
    row = predict(probe, 2, network=Network(1e9, 0.0), engine=EngineCosts(0, 0, 0, 0))
    assert row["compute_s"] == pytest.approx(probe.lead_compute_s + 16 * probe.compute_s)
    assert 0.164 <= row["compute_s"] < 0.35      # not 20 x the six rounds' mean (~0.007)


def test_predict_fanout_messages():
    """An all-to-all round (P - 1 messages a partition, sent concurrently) pays one hop and
    the marginal cost of each further message, not P - 1 hops."""
    probe = Probe(n_partitions=4, rounds=10, rounds_source="probe", max_rounds=10,
                  compute_s=0.0, driver_s=0.0, driver_bytes=0.0, ring_messages=3.0)
    eng = EngineCosts(call_s=0.0, worker_call_s=0.0, message_s=4e-3, round_s=0.0,
                      fanout_message_s=1e-3)
    row = predict(probe, 4, network=Network(1e9, 0.0), engine=eng, cores_per_worker=0.5)
    assert row["overhead_s"] == pytest.approx(10 * (4e-3 + 2 * 1e-3) / 0.5, rel=1e-12)
    one = predict(Probe(**{**probe.__dict__, "ring_messages": 1.0}), 4,
                  network=Network(1e9, 0.0), engine=eng, cores_per_worker=0.5)
    assert one["overhead_s"] == pytest.approx(10 * 4e-3 / 0.5, rel=1e-12)


def test_probe_of_fanout_rounds():
    """`NullProgram(fanout=True)` sends to every other partition: P - 1 messages each."""
    prog = NullProgram(ring_bytes=80, fanout=True, batched=True)
    probe = probe_program(prog, 4, max_iter=8, seconds=30.0)
    assert probe.ring_messages == 3.0
    assert probe.ring_bytes == 3 * 80


def test_probe_stops_after_its_time():
    probe = probe_program(NullProgram(push_s=0.01), 1, max_iter=10_000, seconds=0.1)
    assert probe.rounds_source == "max_iter" and probe.rounds == 10_000
    assert 3 <= probe.probed_rounds < 10_000


def test_probe_of_a_program_whose_rounds_depend_on_p_runs_to_its_stopping_rule():
    """Past its seconds, up to COUNT_FACTOR times them: the rounds the fit takes, not its
    budget; a program without the flag stops at its seconds."""
    counted = probe_program(NullProgram(push_s=0.002, stop_after=120,
                                        probe_to_stopping_rule=True), 2,
                            max_iter=10_000, seconds=0.05)
    assert counted.rounds_source == "probe" and counted.rounds == counted.probed_rounds == 120
    assert counted.probe_s > 0.05
    cut = probe_program(NullProgram(push_s=0.002, stop_after=120), 2, max_iter=10_000,
                        seconds=0.05)
    assert cut.rounds_source == "max_iter" and cut.rounds == 10_000 and cut.probed_rounds < 120
    # the count has its limit too
    capped = probe_program(NullProgram(push_s=0.002, stop_after=100_000,
                                       probe_to_stopping_rule=True), 1,
                           max_iter=1_000_000, seconds=0.01)
    assert capped.rounds_source == "max_iter" and capped.probed_rounds < 100_000
    assert capped.probe_s < 0.01 * COUNT_FACTOR + 2.0
    assert LassoProgram.probe_to_stopping_rule and not NullProgram.probe_to_stopping_rule


@pytest.fixture(scope="module")
def lasso_problem():
    X, y = make_problem(n=120, p=400, density=0.05)
    return X, y


def test_plan_of_a_lasso(lasso_problem):
    X, y = lasso_problem
    est = Lasso(alpha=0.01, tol=1e-5, random_state=0)
    rows = dmp.plan(est, X, y, workers=[1, 2, 8], network="10Gbit,50us", probe_max=2,
                    probe_seconds=0.5, memory_per_worker=None, as_frame=False)
    assert [r["workers"] for r in rows] == [1, 2, 8]
    for r in rows:
        parts = r["compute_s"] + r["driver_s"] + r["comm_s"] + r["overhead_s"]
        assert r["loop_s"] == pytest.approx(parts, rel=1e-9) and r["loop_s"] > 0
        assert r["rounds"] >= 1 and r["memory_per_worker"] > 0 and r["fits"] is None
    assert rows[0]["speedup"] == 1.0
    assert rows[0]["source"].startswith("probe at P=1")
    assert rows[2]["source"].startswith("extrapolated from P=2")
    # the Lasso's probe runs to its stopping rule: its own rounds, not the budget
    assert rows[0]["rounds"] < est.max_iter
    ref = Lasso(alpha=0.01, tol=1e-5, random_state=0, backend="local", n_workers=1).fit(X, y)
    assert rows[0]["rounds"] == ref.n_iter_


def test_plan_refuses_what_does_not_fit(lasso_problem):
    """With the worker's fixed cost set to (almost) nothing, the partitions decide."""
    X, y = lasso_problem
    est = Lasso(alpha=0.01, tol=1e-5, random_state=0)
    with dask.config.set({"dmp.memory.worker-base": 1,
                          "dmp.memory.collect-piece-bytes": 1}):
        first = dmp.plan(est, X, y, workers=[1, 4], probe_max=1, probe_seconds=0.2,
                         memory_per_worker=None, as_frame=False)
        m1, m4 = first[0]["memory_per_worker"], first[1]["memory_per_worker"]
        assert m4 < m1
        limit = int((m1 + m4) / 2 / 0.8)
        rows = dmp.plan(est, X, y, workers=[1, 4], probe_max=1, probe_seconds=0.2,
                        memory_per_worker=limit, as_frame=False)
    assert [r["fits"] for r in rows] == [False, True]
    assert rows[0]["workers_needed"] == 4


def test_plan_refuses_bad_arguments(lasso_problem):
    X, y = lasso_problem
    with pytest.raises(ValueError, match="workers must be a list of whole numbers >= 1"):
        dmp.plan(Lasso(), X, y, workers=[0, 2])
    with pytest.raises(ValueError, match="network must be"):
        dmp.plan(Lasso(), X, y, network="fast")
    with pytest.raises(ValueError, match="cores_per_worker must be a number of cores > 0"):
        dmp.plan(Lasso(), X, y, cores_per_worker=0)
    with pytest.raises(ValueError, match="probe_seconds must be a number > 0"):
        dmp.plan(Lasso(), X, y, probe_seconds=float("nan"))
    with pytest.raises(ValueError, match="cpu_period must be seconds > 0, got '100ms'"):
        dmp.plan(Lasso(), X, y, cores_per_worker=0.5, cpu_period="100ms")


def test_workers_list():
    assert _workers_list("1,2,4,...,1024") == [2**k for k in range(11)]
    assert _workers_list("1,3,...,27") == [1, 3, 9, 27]       # the ratio
    assert _workers_list("2,5,...,11") == [2, 5, 8, 11]       # else the step
    assert _workers_list("8,1,2") == [1, 2, 8]


@pytest.mark.parametrize("argv, says", [
    (["--network", "10Gbit"], "network must be a bandwidth and a latency"),
    (["--workers", "1,0"], "argument --workers: workers must be whole numbers >= 1"),
    (["--workers", "1,2,...,x"], "argument --workers"),
    (["--cores-per-worker", "-1"], "--cores-per-worker must be a number > 0"),
    (["--probe-all-workers"], "--probe-all-workers needs --probe-on ADDRESS"),
    (["--cpu-period", "10 parsecs"], "--cpu-period must be a duration > 0"),
    (["--cpu-period", "-1"], "--cpu-period must be a duration > 0"),
])
def test_cli_plan_refuses(tmp_path, capsys, argv, says):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: p\ndataset: nowhere.zarr\nestimator: {class: Lasso}\n")
    try:
        rc = main(["plan", str(pipeline), *argv])
    except SystemExit as exc:   # argparse's own errors
        rc = exc.code
    assert rc == 2
    assert says in capsys.readouterr().err


def test_cli_plan_of_a_pipeline(tmp_path, capsys, lasso_problem):
    X, y = lasso_problem
    write_sparse(tmp_path / "data.zarr", X, y, n_shards=4)
    pipeline = tmp_path / "lasso.yaml"
    pipeline.write_text(
        "name: tiny\ndataset: data.zarr\nestimator:\n  class: Lasso\n"
        "  params: {alpha_ratio: 0.1, tol: 1.0e-5, random_state: 0}\n"
        "compare: {schedule: [round_robin, priority]}\noutput: out\n")
    png = tmp_path / "plan.png"
    rc = main(["plan", str(pipeline), "--workers", "1,2,...,8", "--probe-max", "1",
               "--probe-seconds", "0.2", "--network", "1Gbit,100us", "--json", "--png",
               str(png)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["workers"] for r in rows] == [1, 2, 4, 8]
    assert all(r["loop_s"] > 0 and r["fits"] is True for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc = main(["plan", str(pipeline), "--workers", "2", "--probe-seconds", "0.2",
               "--cores-per-worker", "0.5", "--cpu-period", "10ms"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tiny: Lasso on" in out and "loop s" in out
    assert "0.5 core(s) per worker (a CPU quota, period 10 ms)" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 1
    assert np.isfinite([r["loop_s"] for r in rows]).all()


def test_cli_plan_probes_on_a_scheduler_s_worker(tmp_path, capsys, lasso_problem,
                                                 dask_client):
    X, y = lasso_problem
    write_sparse(tmp_path / "data.zarr", X, y, n_shards=2)
    pipeline = tmp_path / "lasso.yaml"
    pipeline.write_text("name: tiny\ndataset: data.zarr\nestimator:\n  class: Lasso\n"
                        "  params: {alpha_ratio: 0.1, tol: 1.0e-5, random_state: 0}\n")
    address = dask_client.scheduler.address
    rc = main(["plan", str(pipeline), "--workers", "1,2", "--probe-seconds", "0.2",
               "--probe-on", address, "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    workers = set(dask_client.scheduler_info(n_workers=-1)["workers"])
    where = [r["source"].split(" on ")[1].split(",")[0] for r in rows]
    assert len(where) == 2 and set(where) <= workers
    rc = main(["plan", str(pipeline), "--workers", "2", "--probe-seconds", "0.2",
               "--probe-on", address, "--probe-all-workers", "--json"])
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert "the slowest of 2 workers probing at once" in row["source"]
    rc = main(["plan", str(pipeline), "--workers", "1", "--probe-on", "tcp://127.0.0.1:9"])
    assert rc == 2
    assert "127.0.0.1:9" in capsys.readouterr().err


def test_plan_probes_what_the_store_allows(tmp_path, lasso_problem):
    """A store of 2 shards holds at most 2 partitions: larger P are predicted from the
    probes that could run, and the rows say so."""
    X, y = lasso_problem
    ds = write_sparse(tmp_path / "two.zarr", X, y, n_shards=2)
    rows = dmp.plan(Lasso(alpha=0.01, tol=1e-5, random_state=0), ds, workers=[1, 2, 4],
                    probe_max=4, probe_seconds=0.2, as_frame=False)
    assert [r["source"].split(",")[0] for r in rows] == [
        "probe at P=1", "probe at P=2", "extrapolated from P=2"]
    assert rows[2]["loop_s"] > 0 and rows[2]["memory_per_worker"] > 0


def test_plan_memory_is_the_backends_check(tmp_path, monkeypatch):
    """`plan_memory` of a 4 GiB LDA table answers from the fit's set-up alone (no partition
    is made): per worker, its word block (ceil(V / P) x K int32) and the partition's other
    terms, the piece in flight at the end and the worker's base; ``fits`` agrees with the
    Dask backend's up-front check at the limit either side of it."""
    from dmp.decomposition import LatentDirichletAllocation
    from dmp.decomposition._lda_program import LDAProgram
    from dmp.engine.backends.dask import check_partition_memory
    from dmp.exceptions import InsufficientMemoryError
    from dmp.io import write_sparse_rows
    from dmp.io.synthetic import make_lda_corpus
    from dmp.planning import plan_memory
    from dmp.utils.estimator import seed_from

    V, K, MIB = 10_744, 100_000, 2**20
    X = make_lda_corpus(40, V, 5, 20, seed=0)[0]
    tokens = int(X.sum())
    ds = write_sparse_rows(tmp_path / "corpus.zarr", X, np.zeros(40), n_shards=8)

    def no_partition(self, spec):
        raise AssertionError("plan_memory made a partition")

    monkeypatch.setattr(LDAProgram, "init_partition", no_partition)
    est = LatentDirichletAllocation(K, max_iter=1, random_state=0)
    settings = {"dmp.memory.worker-base": "300MiB", "dmp.memory.collect-piece-bytes": "4MiB",
                "distributed.worker.memory.pause": 0.85}
    with dask.config.set(settings):
        rows = plan_memory(est, ds, workers=[4, 8], memory_per_worker="1GiB", as_frame=False)
    assert [r["workers"] for r in rows] == [4, 8]
    for r, P in zip(rows, (4, 8)):
        # the dense block, the word maps, the collected piece twice, the base; then at most
        # 24 bytes per stored entry and 8 per token of the block in flight (its nonzeros)
        fixed = -(-V // P) * K * 4 + V * 8 + 2 * 4 * MIB + 300 * MIB
        assert fixed <= r["memory_per_worker"] <= fixed + 32 * tokens, (P, r)
        assert r["memory_per_worker"] - r["partition_bytes"] == 2 * 4 * MIB + 300 * MIB
    assert rows[0]["memory_per_worker"] > 0.85 * 2**30 > rows[1]["memory_per_worker"]
    assert [r["fits"] for r in rows] == [False, True] and rows[0]["workers_needed"] == 8

    program = LDAProgram(ds, n_topics=K, alpha=1 / K, beta=1 / K, n_sweeps=1,
                         sampler="sparse", seed=seed_from(0))
    specs = program.partition_specs(8)
    need = rows[1]["memory_per_worker"]
    names = [f"w{k}" for k in range(8)]
    with dask.config.set(settings):
        enough = int(np.ceil(need / 0.85))
        check_partition_memory(program, specs, names, dict.fromkeys(names, enough))
        assert plan_memory(est, ds, workers=[8], memory_per_worker=enough,
                           as_frame=False)[0]["fits"]
        short = enough - 64
        with pytest.raises(InsufficientMemoryError, match="does not fit"):
            check_partition_memory(program, specs, names, dict.fromkeys(names, short))
        assert not plan_memory(est, ds, workers=[8], memory_per_worker=short,
                               as_frame=False)[0]["fits"]


def test_lda_probe_prices_the_counting_rotation_and_first_sweep_apart():
    """LDA's first 2P rounds, the counting rotation and the first sweep from random topics,
    do other work than the later sweeps (`LDAProgram.lead_rounds`): a probe at P = 3 runs
    into the second sweep, prices the lead rounds as measured and the later sub-rounds at
    the second sweep's mean."""
    from dmp.decomposition import LatentDirichletAllocation
    from dmp.io.synthetic import make_lda_corpus
    from dmp.planning import probe_estimator

    X = make_lda_corpus(300, 400, 10, 60, seed=1)[0]
    est = LatentDirichletAllocation(20, max_iter=4, random_state=0)
    # a probe runs batches of rounds as a cluster does, with the next batch in flight: a stop
    # takes effect at the end of the batch after the one it came in; at most 2 rounds a
    # batch here (rounds 0 | 1-2 | 3-4 | 5-6 | ...)
    with dask.config.set({"dmp.batch.max-rounds": 2}):
        warm = probe_estimator(est, X, n_partitions=3, seconds=0.001, warm_up=True)
        pr = probe_estimator(est, X, n_partitions=3, seconds=0.001)
    # the warm-up runs a counting round and the first sampling sub-round
    # (`LDAProgram.warm_up_rounds`), then the batches in flight (rounds 4-6), not the second
    # sweep
    assert 4 <= warm.probed_rounds < 8
    # 3 counting rounds and 3 of the first sweep, then at least 2 of the second (a batch
    # may run on past the stop)
    assert pr.lead_rounds == 6 and pr.probed_rounds >= 8
    assert pr.rounds == 3 + 3 * 4                                  # the fit: 4 sweeps of 3
    # the lead holds three sampling sub-rounds: more than two later ones cost
    assert pr.lead_compute_s > 2 * pr.compute_s > 0
    row = predict(pr, 3, network=Network(1e9, 0.0), engine=EngineCosts(0, 0, 0, 0))
    assert row["compute_s"] == pytest.approx(pr.lead_compute_s + 9 * pr.compute_s)


@pytest.mark.parametrize("staleness", [1, 2])
def test_probe_of_rounds_in_flight_counts_each_push_in_its_round(staleness):
    """With rounds in flight, a round's pushes run before the records of the rounds
    before it: each round's compute is still one push's spin (not two pushes in one
    round and none in the last), and the driver's time is what is left of the thread's."""
    probe = probe_program(NullProgram(push_s=0.004), 2, max_iter=8, seconds=30.0,
                          staleness=staleness)
    assert 0.0035 <= probe.compute_s < 0.006
    assert probe.driver_s < 0.002


def test_probe_on_a_worker_measures_what_the_local_probe_does(lasso_problem, dask_client):
    """``on=client``: the probes run on one of the cluster's worker processes (its address
    in ``where``) and see the same rounds and bytes as the in-process ones; `plan` names the
    worker in its ``source`` column."""
    X, y = lasso_problem
    est = Lasso(alpha=0.01, tol=1e-5, random_state=0)
    here = dmp.planning.probe(est, X, y, workers=[1, 2], seconds=0.5)
    there = dmp.planning.probe(est, X, y, workers=[2, 1], seconds=0.5, on=dask_client)
    addresses = set(dask_client.scheduler_info(n_workers=-1)["workers"])
    assert list(there) == [1, 2]
    for P in (1, 2):
        assert here[P].where == "in process" and there[P].where in addresses
        for field in ("rounds", "max_rounds", "driver_bytes", "partition_bytes"):
            assert getattr(there[P], field) == getattr(here[P], field), (P, field)
        assert there[P].compute_s > 0
    rows = dmp.plan(est, X, y, workers=[1, 2], probe_seconds=0.3, probe_on=dask_client,
                    memory_per_worker=None, as_frame=False)
    assert rows[1]["source"].startswith("probe at P=2 on tcp://127.0.0.1:")
    with pytest.raises(TypeError, match="on must be a distributed.Client"):
        dmp.planning.probe(est, X, y, workers=[1], on="tcp://127.0.0.1:1")
    # every worker at once: the slowest worker's probe, with the same rounds and bytes;
    # an estimator that holds a client (as after a fit on a cluster) goes without it
    est.set_params(backend=dask_client)
    busy = dmp.planning.probe(est, X, y, workers=[1, 2], seconds=0.5, on=dask_client,
                              all_workers=True)
    assert est.backend is dask_client
    for P in (1, 2):
        assert busy[P].where.startswith("the slowest of 2 workers probing at once (tcp://")
        assert busy[P].where.split("(")[1].rstrip(")") in addresses
        for field in ("rounds", "max_rounds", "driver_bytes", "partition_bytes"):
            assert getattr(busy[P], field) == getattr(here[P], field), (P, field)
    rows = dmp.plan(est, X, y, workers=[1, 2], probe_seconds=0.3, probe_on=dask_client,
                    probe_all_workers=True, memory_per_worker=None, as_frame=False)
    assert "the slowest of 2 workers probing at once" in rows[1]["source"]
    with pytest.raises(ValueError, match="probe_all_workers needs probe_on"):
        dmp.plan(est, X, y, workers=[1], probe_all_workers=True)
    with pytest.raises(ValueError, match="all_workers needs on"):
        dmp.planning.probe(est, X, y, workers=[1], all_workers=True)
    with pytest.raises(ValueError, match="seconds must be a number > 0"):
        dmp.planning.probe(est, X, y, workers=[1], seconds=0)


def test_probes_of_all_workers_keep_the_slowest():
    """For each P the probe whose pushes took longest, whichever worker ran it."""
    def pr(P, compute, where):
        return Probe(n_partitions=P, rounds=5, rounds_source="stopping rule", max_rounds=9,
                     compute_s=compute, driver_s=0.001, driver_bytes=8, where=where)

    got = dmp.planning._slowest([{1: pr(1, 0.010, "a"), 2: pr(2, 0.030, "a")},
                                 {1: pr(1, 0.020, "b"), 2: pr(2, 0.025, "b")},
                                 {1: pr(1, 0.015, "c")}])
    assert list(got) == [1, 2]
    assert got[1].compute_s == 0.020 and got[1].where.endswith("3 workers probing at once (b)")
    assert got[2].compute_s == 0.030 and got[2].where.endswith("2 workers probing at once (a)")
