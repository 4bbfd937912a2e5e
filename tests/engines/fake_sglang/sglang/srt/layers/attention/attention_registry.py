from sglang.srt.utils import get_device_capability

ATTENTION_BACKENDS = {}


def register_attention_backend(name):
    def decorator(fn):
        ATTENTION_BACKENDS[name] = fn
        return fn

    return decorator


@register_attention_backend("triton")
def create_triton_backend(runner):
    from sglang.srt.layers.attention.fake_backend import FakeTritonBackend

    return FakeTritonBackend(runner)


@register_attention_backend("fake_mla")
def create_fake_mla_backend(runner):
    if not runner.use_mla_backend:
        raise ValueError("fake_mla backend can only be used with MLA models.")
    major, _ = get_device_capability()
    assert major is not None and major >= 9, "fake_mla needs SM90 or newer"
    from sglang.srt.layers.attention.fake_backend import FakeMLABackend

    return FakeMLABackend(runner)


@register_attention_backend("cuda_probe")
def create_cuda_probe_backend(runner):
    from sglang.srt.layers.attention.fake_backend import CudaProbeBackend

    return CudaProbeBackend(runner)


@register_attention_backend("mha_only")
def create_mha_only_backend(runner):
    if runner.use_mla_backend:
        raise ValueError("mha_only backend can only be used with non-MLA models.")
    from sglang.srt.layers.attention.fake_backend import FakeTritonBackend

    return FakeTritonBackend(runner)


@register_attention_backend("fake_wrapper")
def create_fake_wrapper_backend(runner):
    from sglang.srt.layers.attention.fake_backend import FakeWrapperBackend

    return FakeWrapperBackend(runner)
