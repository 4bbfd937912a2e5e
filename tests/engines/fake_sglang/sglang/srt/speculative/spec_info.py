import enum


class SpeculativeAlgorithm(enum.Enum):
    NONE = enum.auto()
    EAGLE = enum.auto()

    @classmethod
    def from_string(cls, name):
        return cls.NONE if name is None else cls[name.upper()]

    def create_worker(self, server_args):
        from sglang.srt.speculative.eagle_worker import EAGLEWorker

        return EAGLEWorker
