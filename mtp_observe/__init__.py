"""mtp-observe: replay recorded sessions through a Qwen3.5-family target, run its MTP draft head
at every position without committing anything, and report whether MTP speculative decoding pays.

Stages, in pipeline order (imports go one way, later stages may import earlier ones' data):
sessions -> checkpoint -> target -> mtp -> acceptance -> tables -> report; the pipeline and
the CLI tie them together.
"""

__version__ = "0.1.0"
