"""Binary hashing for fast retrieval: codes, Hamming search, linear baselines and the binary
autoencoder's Z step (ParMAC, ALGORITHMS.md part 2)."""

from ._itq import LinearHash, itq, pca_hash, quantization_loss
from ._retrieval import (euclidean_neighbors, hamming_search, pack_codes,
                         retrieval_precision, unpack_codes)
from ._zstep import z_step

__all__ = ["LinearHash", "itq", "pca_hash", "quantization_loss", "euclidean_neighbors",
           "hamming_search", "pack_codes", "retrieval_precision", "unpack_codes", "z_step"]
