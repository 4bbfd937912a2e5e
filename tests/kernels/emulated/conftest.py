"""The ``gpu_emulation`` marker: tests that hold an emulation against the real library kernel.

``benchmarks/gpu.sh`` runs them with ``-m gpu_emulation``; they skip without
CUDA or without the library.
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_emulation: runs a real library kernel beside its float64 emulation "
                                       "(needs CUDA and the library; benchmarks/gpu.sh selects these)")
