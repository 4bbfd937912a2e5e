"""A fake ``sglang`` for the adapter's tests: SGLang's start-up call shapes, a few hand-written checks.

It has what ``pytest_mla/engines/sglang.py`` drives in a real release
(``runtime_context.override_platform``, ``ServerArgs.resolve_once``, the
attention-backend registry, the model runner's builder, the EAGLE draft
worker and ``DraftBackendFactory``), each a few lines, and its own checks:

* ``fake_mla`` factory: MLA models only; ``FakeMLABackend.__init__`` refuses
  fp8_e5m2 KV before its first GPU step (a workspace on CUDA), and has a
  check *after* it that the adapter must never reach;
* ``FakeMLAMultiStepDraftBackend.__init__`` (the draft decode backend)
  refuses draft trees;
* ``cuda_probe``: its constructor asserts CUDA (``AssertionError: Torch not
  compiled with CUDA enabled`` on this host) after its checks: a GPU step,
  not a refusal; it has no EAGLE draft backend;
* ``mha_only`` factory: non-MLA models only.

Environment switches (read at import): ``FAKE_SGLANG_EXTRA_FACT=1`` adds a
platform fact no adapter can derive; ``FAKE_SGLANG_NO_DRAFT_FACTORY=1``
removes ``DraftBackendFactory`` (a hook that moved).
"""
