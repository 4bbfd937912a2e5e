from sglang.srt.utils.common import get_device_capability  # noqa: F401
