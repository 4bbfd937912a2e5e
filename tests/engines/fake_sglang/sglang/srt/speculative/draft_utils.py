import os

from sglang.srt.runtime_context import attention_backends


class DraftBackendFactory:
    def __init__(self, draft_model_runner, topk, speculative_num_steps):
        self.draft_model_runner = draft_model_runner
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps

    def _create_backend(self, backend_name, backend_map, error_template):
        prefill, decode = attention_backends()
        backend_type = decode if backend_name == "decode_attention_backend" else prefill
        if backend_type not in backend_map:
            raise ValueError(error_template.format(backend_type=backend_type))
        return backend_map[backend_type]()

    def create_decode_backend(self):
        if self.speculative_num_steps <= 1:
            return None
        return self._create_backend("decode_attention_backend", {
            "fake_mla": self._create_fake_mla_decode_backend,
            "triton": self._create_triton_backend,
        }, "EAGLE is not supported in decode attention backend {backend_type}")

    def create_draft_extend_backend(self):
        return self._create_backend("prefill_attention_backend", {
            "fake_mla": self._create_fake_mla_prefill_backend,
            "triton": self._create_triton_backend,
        }, "EAGLE is not supported in attention backend {backend_type}")

    def _create_fake_mla_decode_backend(self):
        from sglang.srt.layers.attention.fake_backend import FakeMLAMultiStepDraftBackend

        return FakeMLAMultiStepDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps)

    def _create_fake_mla_prefill_backend(self):
        from sglang.srt.layers.attention.fake_backend import FakeMLABackend

        return FakeMLABackend(self.draft_model_runner, skip_prefill=False)

    def _create_triton_backend(self):
        from sglang.srt.layers.attention.fake_backend import FakeTritonBackend

        return FakeTritonBackend(self.draft_model_runner)


if os.environ.get("FAKE_SGLANG_NO_DRAFT_FACTORY"):
    del DraftBackendFactory
