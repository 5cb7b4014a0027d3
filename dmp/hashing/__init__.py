"""Binary hashing for fast retrieval: the binary autoencoder trained by ParMAC, codes and
Hamming search, linear baselines (PCA hashing, ITQ) and the ParMAC speed-up model
(docs/algorithms.md, "ParMAC binary autoencoders")."""

from ._ba import BinaryAutoencoder
from ._itq import LinearHash, itq, pca_hash, quantization_loss
from ._retrieval import (euclidean_neighbors, hamming_search, pack_codes,
                         retrieval_precision, unpack_codes)
from ._speedup import measured_costs, parmac_speedup, parmac_time
from ._zstep import z_step

__all__ = ["BinaryAutoencoder", "LinearHash", "itq", "pca_hash", "quantization_loss",
           "euclidean_neighbors", "hamming_search", "pack_codes", "retrieval_precision",
           "unpack_codes", "z_step", "parmac_time", "parmac_speedup", "measured_costs"]
