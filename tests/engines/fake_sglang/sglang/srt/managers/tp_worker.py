from sglang.srt.runtime_context import get_model, get_spec


class TpModelWorker:
    def _init_model_config(self):
        from sglang.srt.configs.model_config import ModelConfig

        self.model_config = ModelConfig.from_server_args(
            self.server_args,
            model_path=get_model().model_path if not self.is_draft_worker else get_spec().speculative_draft_model_path,
            is_draft_model=self.is_draft_worker,
            context_length=self.context_length,
        )
