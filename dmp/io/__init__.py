"""Data input/output: column- and row-block sparse datasets and ratings datasets (Zarr v3),
svmlight, ratings and document-collection files, synthetic data, and dataset recipes."""

from .dense import (DenseDataset, InMemoryDenseDataset, append_dense_shard,
                    convert_features, read_features, read_vecs, write_dense)
from .corpus import convert_corpus, read_text_corpus, read_uci_bow
from .ratings import (InMemoryRatingsDataset, RatingsDataset, convert_ratings,
                      read_ratings_file, write_ratings)
from .recipes import build_dataset, default_cache_dir, load_recipe
from .rows import InMemorySparseRowDataset, SparseRowDataset, write_sparse_rows
from .sparse import DatasetError, SparseDataset, open_dataset, write_sparse
from .svmlight import convert_svmlight, read_svmlight
from .synthetic import (lasso_alpha_max, make_correlated_lasso, make_hashing_mixture,
                        make_ratings,
                        make_sparse_lasso)

__all__ = [
    "DatasetError", "SparseDataset", "write_sparse", "open_dataset", "SparseRowDataset",
    "InMemorySparseRowDataset", "write_sparse_rows", "read_svmlight",
    "convert_svmlight", "make_sparse_lasso", "make_correlated_lasso", "lasso_alpha_max",
    "load_recipe", "build_dataset", "default_cache_dir", "RatingsDataset",
    "InMemoryRatingsDataset", "write_ratings", "read_ratings_file", "convert_ratings",
    "make_ratings", "read_uci_bow", "read_text_corpus", "convert_corpus", "DenseDataset",
    "InMemoryDenseDataset", "write_dense", "append_dense_shard", "read_vecs", "read_features",
    "convert_features", "make_hashing_mixture",
]
