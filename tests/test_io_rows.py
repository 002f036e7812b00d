"""as_rows and default_row_chunk: every input kind, its chunk structure, every bad input."""

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

from dkern.io import as_rows, default_row_chunk, write_array


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


@pytest.mark.parametrize(
    ("n", "n_cols", "itemsize", "expected"),
    [
        (1000, 10, 8, 1000),  # 16 MiB would hold 209_715 rows: one chunk
        (100_000, 1000, 8, 2097),  # floor(16 MiB / 8000 B)
        (4096, 1, 8, 2048),  # n >= 2048: at most ceil(n / 2)
        (4097, 1, 8, 2049),
        (2047, 1, 8, 2047),  # below 2048 one chunk is fine
        (10, 10**7, 8, 1),  # rows wider than 16 MiB: still one row
        (0, 3, 8, 1),
    ],
)
def test_default_row_chunk(n, n_cols, itemsize, expected):
    assert default_row_chunk(n, n_cols, itemsize) == expected


def test_numpy_int_becomes_float64_one_row_chunked_array():
    x = np.arange(30).reshape(10, 3)
    out = as_rows(x, name="X")
    assert out.dtype == np.float64
    assert out.chunks == ((10,), (3,))
    np.testing.assert_array_equal(out.compute(), x.astype(np.float64))
    assert out.name.startswith("dk-X-")


def test_list_input_row_chunks_and_float32_cast():
    out = as_rows([[1.5, 2.0]] * 10, name="X", row_chunks=4, dtype=np.float32)
    assert out.dtype == np.float32
    assert out.chunks == ((4, 4, 2), (2,))
    np.testing.assert_array_equal(out.compute(), np.full((10, 2), [1.5, 2.0], np.float32))


def test_float32_kept_without_dtype():
    assert as_rows(np.ones((3, 2), np.float32), name="X").dtype == np.float32


def test_one_d_and_either_ndim():
    y = np.arange(5.0)
    assert as_rows(y, name="y", ndim=1).chunks == ((5,),)
    assert as_rows(y, name="y", ndim=(1, 2)).ndim == 1
    assert as_rows(y.reshape(5, 1), name="y", ndim=(1, 2)).ndim == 2


def test_dask_keeps_row_chunks_unless_given():
    x = da.ones((10, 3), chunks=((3, 3, 4), (3,)))
    assert as_rows(x, name="X").chunks == ((3, 3, 4), (3,))
    assert as_rows(x, name="X", row_chunks=5).chunks == ((5, 5), (3,))
    assert as_rows(x, name="X", check_finite=False) is x
    gaps = da.ones((10, 3), chunks=((3, 0, 7, 0), (3,)))  # empty chunks go: nothing in them
    assert as_rows(gaps, name="X").chunks == ((3, 7), (3,))


def test_dask_int_is_cast_lazily():
    x = da.arange(12, chunks=5).reshape(6, 2)
    out = as_rows(x, name="X", row_chunks=3)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.compute(), np.arange(12.0).reshape(6, 2))


def test_zarr_array_spans_whole_zarr_chunks_and_merges_features():
    z = zarr.create_array(
        zarr.storage.MemoryStore(), shape=(300, 3), chunks=(64, 2), dtype="f8", fill_value=0
    )
    z[...] = np.arange(900.0).reshape(300, 3)
    out = as_rows(z, name="X")
    # default_row_chunk(300, 3, 8) = 300 rows -> 4 whole zarr chunks of 64 = 256
    assert out.chunks == ((256, 44), (3,))
    np.testing.assert_array_equal(out.compute(), np.arange(900.0).reshape(300, 3))


def test_store_tuple_input(tmp_path):
    x = np.arange(2000.0).reshape(1000, 2)
    write_array(x, tmp_path / "s", "X", chunk_rows=50)
    out = as_rows((tmp_path / "s", "X"), name="X")
    assert out.chunks == ((1000,), (2,))  # 20 whole zarr chunks
    assert as_rows((tmp_path / "s", "X"), name="X", row_chunks=300).chunks == (
        (300, 300, 300, 100),
        (2,),
    )
    np.testing.assert_array_equal(out.compute(), x)


@pytest.mark.parametrize("rows", [((1.0, 2.0), (3.0, 4.0)), ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0))])
def test_a_tuple_of_rows_is_data_not_a_store(rows):
    """Only (str or path, str) names a stored array; scikit-learn takes tuples as array-likes."""
    np.testing.assert_array_equal(as_rows(rows, name="X").compute(), np.array(rows))


def test_zarr_chunk_bigger_than_default_is_read_whole():
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(5000, 1), chunks=(4000, 1), dtype="f8")
    z[...] = 1.0
    # default_row_chunk(5000, 1, 8) = 2500 < 4000: keep one whole zarr chunk per task
    assert as_rows(z, name="X").chunks == ((4000, 1000), (1,))


def test_wrong_ndim_message_names_operand_shape_and_fix():
    with pytest.raises(ValueError) as info:
        as_rows(np.ones(5), name="X")
    assert str(info.value) == (
        "X must be 2-D (n_samples, n_features); got shape (5,). "
        "Use X.reshape(-1, 1) for a single feature."
    )
    with pytest.raises(
        ValueError,
        match=r"y must be 1-D \(n_samples,\); got shape \(4, 1\)\. "
        r"Use y\.ravel\(\)",
    ):
        as_rows(np.ones((4, 1)), name="y", ndim=1)
    with pytest.raises(ValueError, match=r"Z must be 1-D \(n_samples,\) or 2-D"):
        as_rows(da.ones((2, 2, 2)), name="Z", ndim=(1, 2))


@pytest.mark.parametrize(
    "x",
    [
        np.array([["a", "b"]]),
        np.array([[1, None]], dtype=object),
        np.ones((2, 2), dtype=bool),
        np.ones((2, 2), dtype=complex),
        da.ones((2, 2), dtype=bool),
    ],
)
def test_non_numeric_dtype_is_a_type_error(x):
    with pytest.raises(
        TypeError, match=f"X must hold integers or floating-point numbers; got dtype {x.dtype}"
    ):
        as_rows(x, name="X")


def test_chunked_feature_axis_gives_exact_fix():
    x = da.ones((10, 4), chunks=(5, 2))
    with pytest.raises(ValueError) as info:
        as_rows(x, name="X")
    assert "axes [1] have [2] chunks" in str(info.value)
    assert str(info.value).endswith("Use X.rechunk({1: -1}).")


@pytest.mark.parametrize("x", [np.ones((0, 3)), da.ones((0, 3), chunks=(1, 3))])
def test_zero_rows(x):
    with pytest.raises(ValueError, match=r"X has zero rows \(shape \(0, 3\)\)"):
        as_rows(x, name="X")


def test_nan_in_numpy_is_found_eagerly_with_first_row():
    x = np.ones((10, 2))
    x[7, 1] = np.nan
    x[9, 0] = np.inf
    with pytest.raises(
        ValueError,
        match=r"X contains NaN or infinity in 2 rows, the first at "
        r"row 7",
    ):
        as_rows(x, name="X")
    assert np.isnan(as_rows(x, name="X", check_finite=False).compute()[7, 1])


def test_nan_in_dask_raises_at_compute_naming_rows():
    x = np.ones((40, 2))
    x[23, 0] = np.nan
    out = as_rows(da.from_array(x, chunks=(10, 2)), name="X")  # building does not raise
    assert out.name.startswith("dk-check-X-")
    np.testing.assert_array_equal(out[:20].compute(), np.ones((20, 2)))  # clean chunks pass
    with pytest.raises(
        ValueError,
        match=r"X contains NaN or infinity in rows \[20, 30\) "
        r"\(first at row 23\)",
    ):
        out.compute()


@pytest.mark.parametrize("shape", [(30, 2), (30,)], ids=["rows", "vector"])
def test_an_empty_chunk_is_checked_as_rows_of_nothing(shape):
    """A dask array with a 0-row chunk (a filter's result, a rechunk) failed its finite
    check with "cannot reshape array of size 0 into shape (0,newaxis)"; a NaN after it
    is still named by its global row."""
    x = np.arange(np.prod(shape), dtype=float).reshape(shape)
    chunks = ((10, 0, 20),) + tuple((c,) for c in shape[1:])
    out = as_rows(da.from_array(x, chunks=chunks), name="X", ndim=len(shape))
    np.testing.assert_array_equal(out.compute(), x)
    x[25] = np.nan
    with pytest.raises(ValueError, match=r"rows \[10, 30\) \(first at row 25\)"):
        as_rows(da.from_array(x, chunks=chunks), name="X", ndim=len(shape)).compute()


def test_inf_in_zarr_raises_at_compute():
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(30,), chunks=(10,), dtype="f4")
    z[...] = np.arange(30, dtype="f4")
    z[15] = np.inf
    out = as_rows(z, name="y", ndim=1)
    with pytest.raises(
        ValueError,
        match=r"y contains NaN or infinity in rows \[0, 30\) "
        r"\(first at row 15\)",
    ):
        out.compute()


def test_unknown_chunks_asks_for_compute_chunk_sizes():
    x = da.ones((10, 2), chunks=(5, 2))
    x = x[x[:, 0] > 0]
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        as_rows(x, name="X")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": np.int32}, "dtype must be None, numpy.float32 or numpy.float64"),
        ({"row_chunks": 0}, "row_chunks must be a positive int; got 0"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        as_rows(np.ones((3, 2)), name="X", **kwargs)
