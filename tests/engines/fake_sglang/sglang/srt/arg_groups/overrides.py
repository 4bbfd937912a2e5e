def model_config_of(server_args):
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig.from_server_args(server_args)


def resolution_result(server_args, field, default=None):
    return getattr(server_args, field, default)
