"""One process of the two-process test (tests/test_distributed.py); not a test module.

    python tests/_distributed_worker.py PORT PROCESS_ID OUT.npz STRATEGY

Joins a 2-process JAX runtime on 127.0.0.1 with 2 CPU devices per process,
runs a short reconstruction with ``STRATEGY`` over all 4 global devices and
(process 0) saves samples, position and KL energies; with ``shard_map`` also a
model-parallel run (``model_shards=2``, the data blocks split over the processes)
and a field-parallel one (the grid rows of the data and the field split over the
processes, each process building only its rows).
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"


def join(port: int, process_id: int, **kwargs) -> None:
    """Join the 2-process runtime on 127.0.0.1 (2 CPU devices per process), before any JAX computation."""
    from _timeouts import scaled

    import shardvi as sv  # imports jax but runs no JAX computation

    sv.parallel.initialize_distributed(
        f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        local_device_count=2,
        initialization_timeout=int(scaled(60)),
        **kwargs,
    )
    # the test session's persistent compilation cache (tests/conftest.py), where it has one: the two-process
    # runs of tests/test_distributed.py compile the same programs (a cache hit is the executable XLA compiled
    # for the same HLO and options: the same bits)
    from _session_cache import use_session_cache

    use_session_cache()


def main(port: int, process_id: int, out: str, strategy: str) -> None:
    import shardvi as sv

    join(port, process_id)
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from _parallel_problem import final_arrays, run_reconstruction

    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    strat = {"shard_map": sv.parallel.ShardMap, "jit": sv.parallel.JitSharding}[strategy]()  # all 4 devices
    samples, state = run_reconstruction(strat)
    arrays = final_arrays(samples, state)  # replicated outputs: every process can read them
    if process_id == 0:
        np.savez(out, *arrays)
    if strategy == "shard_map":  # model parallelism: the data blocks split over the two processes
        from _model_parallel_problem import masked_local_blocks, masked_problem, run_layout, start_position

        from shardvi.vi.blocked import assemble_process_blocks

        model, _, _ = masked_problem()
        pos = start_position(model)  # the start of the one-device reference (one_device_run)
        d = jax.devices()  # process-major: rows (p0, p1) put the model axis across the processes
        mp = sv.parallel.ShardMap(devices=[d[0], d[2], d[1], d[3]], model_shards=2)
        # each process loads only its 2 of the 4 data blocks (column p of the mesh) and joins the others'
        blocked = assemble_process_blocks(masked_local_blocks(2 * process_id, 2), mp)
        got, kl, _ = run_layout(blocked, pos, mp)
        if process_id == 0:
            np.savez(out.replace(".npz", "_model.npz"), *[np.asarray(a) for a in got], kl=np.asarray(kl))
        field_split_run(mp, process_id, out.replace(".npz", "_field.npz"))
    sv.parallel.shutdown_distributed()


def field_split_run(mp, process_id: int, out: str) -> None:
    """Field parallelism over the two processes: the data, the noise and the start's excitations split by rows
    (``sv.parallel.field_array``: each process builds only its rows); saves the run's arrays, gathered whole."""
    import jax
    import numpy as np
    from _model_parallel_problem import run_layout
    from jax.experimental import multihost_utils
    from jax.tree_util import Partial
    from test_field_split import exp_of, field, problem

    import shardvi as sv

    _, d, std, pos = problem()
    rows = sv.parallel.process_rows(mp, d.shape)
    assert rows == slice(4 * process_id, 4 * process_id + 4), rows  # the model axis runs across the processes

    def split(a):
        return sv.parallel.field_array(mp, a.shape, lambda r: np.asarray(a)[r])

    # the field's power index split like the data (each process builds its rows only)
    cf = sv.parallel.field_model(mp, field())
    index = cf.grids[0].power_index
    assert not index.is_fully_addressable and {s.data.shape for s in index.addressable_shards} == {(4, 8)}
    model = sv.Model(Partial(exp_of, cf), cf.domain)
    lh = sv.Gaussian(split(d), noise_std=split(std)).amend(model, field_blocks=4)
    # other arrays of the model split over processes are refused (the engine reads only power indices by rows)
    weighted = sv.Model(Partial(lambda w, c, xi: w * exp_of(c, xi), split(np.ones(d.shape)), cf), cf.domain)
    try:
        sv.Gaussian(split(d), noise_std=split(std)).amend(weighted, field_blocks=4)
    except ValueError as err:
        assert "not the power index" in str(err), err
    else:
        raise AssertionError("a model array split over processes that is no power index was accepted")
    # the data of a Mask given on its grid, each process building its rows only: they stay split, and hold what
    # the data given whole as the mask's vector give
    from test_field_split import masked, masked_on_grid

    mmodel, md, mstd = masked()
    gd, gstd = masked_on_grid()
    on_grid = sv.Gaussian(split(gd), noise_std=split(gstd)).amend(mmodel, field_blocks=4)
    as_vector = sv.Gaussian(md, noise_std=mstd).amend(mmodel, field_blocks=4)
    assert not on_grid.likelihood.data.is_fully_addressable
    for a, b in zip(jax.tree.leaves(on_grid.likelihood), jax.tree.leaves(as_vector.likelihood), strict=True):
        split_a = isinstance(a, jax.Array) and not a.is_fully_addressable
        whole = multihost_utils.process_allgather(a, tiled=True) if split_a else np.asarray(a)
        assert np.array_equal(whole, np.asarray(b)), "Mask data given on the grid differ"
    data = lh.likelihood.data
    assert not data.is_fully_addressable and {s.data.shape for s in data.addressable_shards} == {(4, 8)}
    start = jax.tree.map(lambda x: split(x) if x.shape == d.shape else x, pos)
    # the other pixel-wise likelihoods take split data too (checked alike on every process, kept split)
    counts, dof = split(np.round(np.abs(d) * 10)), split(np.full(d.shape, 4.0))
    assert not sv.Poisson(counts).counts.is_fully_addressable
    t = sv.StudentT(split(d), dof=dof, noise_std=split(std))
    expect = np.sqrt(5.0 / 7.0) / np.asarray(std)
    assert np.array_equal(multihost_utils.process_allgather(t.fisher_sqrt, tiled=True), expect)
    try:  # the ELBO needs whole arrays: refused on the likelihood, before the samples are read
        sv.estimate_evidence_lower_bound(lh, None)  # pyright: ignore[reportArgumentType]
    except ValueError as err:
        assert "split over processes" in str(err), err
    else:
        raise AssertionError("the ELBO of a likelihood split over processes did not raise")
    try:  # a one-device strategy cannot hold arrays split over processes
        sv.optimize_kl(
            lh, start, key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=1, sample_map="vmap", progress=False
        )
    except ValueError as err:
        assert "split over processes" in str(err), err
    else:
        raise AssertionError("Vmap with arrays split over processes did not raise")
    got, kl, _ = run_layout(lh, start, mp)
    whole = [np.asarray(multihost_utils.process_allgather(a, tiled=True)) for a in got]
    if process_id == 0:
        np.savez(out, *whole, kl=np.asarray(kl))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
