"""Binary hashing for fast retrieval: the binary autoencoder trained by ParMAC, codes and
Hamming search, linear baselines (PCA hashing, ITQ) and the ParMAC speed-up model
(docs/algorithms.md, "ParMAC binary autoencoders")."""

from ..utils._lazy import lazy_exports

_EXPORTS = {
    "BinaryAutoencoder": "._ba",
    "LinearHash": "._itq", "itq": "._itq", "pca_hash": "._itq", "quantization_loss": "._itq",
    "euclidean_neighbors": "._retrieval", "hamming_search": "._retrieval",
    "pack_codes": "._retrieval", "retrieval_precision": "._retrieval",
    "unpack_codes": "._retrieval",
    "measured_costs": "._speedup", "parmac_speedup": "._speedup", "parmac_time": "._speedup",
    "z_step": "._zstep",
}

__all__ = ["BinaryAutoencoder", "LinearHash", "itq", "pca_hash", "quantization_loss",
           "euclidean_neighbors", "hamming_search", "pack_codes", "retrieval_precision",
           "unpack_codes", "z_step", "parmac_time", "parmac_speedup", "measured_costs"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
