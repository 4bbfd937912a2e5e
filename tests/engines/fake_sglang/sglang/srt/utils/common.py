def get_device_capability(device_id=0):
    return None, None  # a CPU host
