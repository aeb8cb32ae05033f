"""The transcript: every captured message of one run in SQLite, judged by the nodes' own rules.

:mod:`~adversary.transcript.writer` stores and judges what the capture delivers
(:class:`Transcript`); :mod:`~adversary.transcript.reader` is the file's schema and read side
(:class:`TranscriptReader`); :mod:`~adversary.transcript.arrays` reads the public part of a run
as the arrays the attack works on. The names below are re-exported lazily (see
:mod:`nlagg_node.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlagg_node.lazy import lazy_exports

if TYPE_CHECKING:
    from .arrays import TranscriptData as TranscriptData
    from .arrays import load_transcript_arrays as load_transcript_arrays
    from .arrays import read_truth as read_truth
    from .reader import MAX_INVALID_PAYLOAD as MAX_INVALID_PAYLOAD
    from .reader import TranscriptReader as TranscriptReader
    from .reader import captured_count as captured_count
    from .store import EpochStore as EpochStore
    from .store import is_epoch_store as is_epoch_store
    from .writer import Captured as Captured
    from .writer import Transcript as Transcript

__all__, __getattr__ = lazy_exports(__name__, __file__)
