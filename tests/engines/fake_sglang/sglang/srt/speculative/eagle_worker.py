from sglang.srt.speculative.draft_utils import DraftBackendFactory


class EagleDraftWorker:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("loads the draft model on the GPU")

    def init_attention_backend(self):
        factory = DraftBackendFactory(self.draft_runner, self.topk, self.speculative_num_steps)
        self.draft_attn_backend = factory.create_decode_backend()
        self.draft_extend_attn_backend = factory.create_draft_extend_backend()


class EAGLEWorker:
    pass
