"""ParMAC on a real Dask cluster: dask arrays and stored points read by the workers (with a
shard that joins later).  (The same result as in process, and after a worker killed during
the W step: tests/test_conformance.py.)"""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dmp.hashing import BinaryAutoencoder, euclidean_neighbors, hamming_search, \
    retrieval_precision
from dmp.io import append_dense_shard, open_dataset, write_dense

pytestmark = [pytest.mark.dask, pytest.mark.slow]


@pytest.fixture(scope="module")
def digits():
    X = load_digits().data
    perm = np.random.default_rng(0).permutation(len(X))
    return X[perm[300:]], X[perm[:300]]


def _precision(ba, Db, Q, n_bits=16):
    truth = euclidean_neighbors(Q, Db, 50)
    found, _ = hamming_search(ba.transform(Q), ba.transform(Db), 50, n_bits)
    return retrieval_precision(found, truth)[0]


def test_dask_array_input_is_written_by_blocks_and_gives_the_numpy_model(dask_client, digits):
    da = pytest.importorskip("dask.array")
    Db, _ = digits
    kw = dict(max_iter=3, random_state=0, n_workers=2, backend="dask")
    ref = BinaryAutoencoder(16, **kw).fit(Db)
    ba = BinaryAutoencoder(16, **kw).fit(da.from_array(Db, chunks=(400, 64)))
    np.testing.assert_array_equal(ba.coef_, ref.coef_)
    bad = da.from_array(np.where(np.arange(Db.size).reshape(Db.shape) == 3, np.nan, Db),
                        chunks=(400, 64))
    with pytest.raises(ValueError, match="NaN"):
        BinaryAutoencoder(16, **kw).fit(bad)


def test_stored_points_and_a_shard_that_joins(dask_client, digits, tmp_path):
    Db, Q = digits
    ds = write_dense(tmp_path / "pts.zarr", Db[:1000], n_shards=3)
    ds = append_dense_shard(ds, Db[1000:])
    ds = open_dataset(tmp_path / "pts.zarr")
    assert ds.n_shards == 4 and ds.n_samples == len(Db)
    ba = BinaryAutoencoder(16, max_iter=6, random_state=0, backend="dask", n_workers=3)
    ba.fit(ds, arrivals={2: [3]})
    assert ba.n_samples_fit_ == len(Db) and ba.n_iter_ >= 3
    assert _precision(ba, Db, Q) > 0.5


