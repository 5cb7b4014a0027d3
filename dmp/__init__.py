"""dmp: dynamic model parallelism on Dask (STRADS, ParMAC, independent sparsification)."""

__version__ = "0.1.0"
