def resolve_sliding_window_size(model, model_config):
    return None
