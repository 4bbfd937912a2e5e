import torch


class FakeTritonBackend:
    def __init__(self, model_runner, skip_prefill=False):
        self.device = model_runner.device
        self.max_bs = model_runner.req_to_token_pool.size  # the KV pools live on the GPU


class FakeMLABackend:
    def __init__(self, model_runner, skip_prefill=False, kv_indptr_buf=None):
        if model_runner.kv_cache_dtype == torch.float8_e5m2:
            raise ValueError("FakeMLA does not support kv-cache-dtype fp8_e5m2.")
        self.max_context_len = model_runner.model_config.context_len
        self.workspace = torch.empty(1024, dtype=torch.uint8, device=model_runner.device)
        raise ValueError("this check comes after the first GPU step: never reached without a GPU")


class FakeMLAMultiStepDraftBackend:
    def __init__(self, model_runner, topk, speculative_num_steps):
        if topk > 1:
            raise ValueError("Currently FakeMLA only supports topk=1 for speculative decoding")
        self.kv_indptr = torch.zeros((speculative_num_steps, 9), dtype=torch.int32, device=model_runner.device)
        self.attn_backends = [FakeMLABackend(model_runner, skip_prefill=True, kv_indptr_buf=self.kv_indptr[i])
                              for i in range(speculative_num_steps - 1)]


class CudaProbeBackend:
    def __init__(self, model_runner):
        if model_runner.page_size not in (1, 64):
            raise ValueError("cuda_probe needs page size 1 or 64")
        # What torch says on a CPU-only host when code asks for CUDA its own way.
        assert torch.cuda.is_available(), "Torch not compiled with CUDA enabled"
        self.stream = torch.cuda.Stream()


class FakeWrapperBackend:
    """Like MiniCPMSparseBackend: builds an inner backend, copies its fields, then makes its own check."""

    def __init__(self, model_runner):
        self.inner = FakeTritonBackend(model_runner)  # stops at its GPU step, having set .device
        self.device = self.inner.device
        self.max_bs = self.inner.max_bs  # never set by the stopped inner constructor
        if not model_runner.use_mla_backend:
            raise ValueError("fake_wrapper serves MLA models only")
        self.slots = torch.zeros(self.max_bs, dtype=torch.int32)  # uses the unset field: the GPU step
