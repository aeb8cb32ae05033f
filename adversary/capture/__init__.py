"""The eavesdropper's capture: its session, one stream over several brokers, and the eavesdropper.

Its MQTT client is the nodes' adapter, :class:`~nlagg_node.runtime.mqtt.MqttTransport`, with
``manual_ack`` (:meth:`~adversary.capture.session.CaptureSession.subscriber`): a message is
acknowledged only once the transcript has committed it; :mod:`~adversary.capture.merged` reads the
bridged site brokers of one run as one stream; :mod:`~adversary.capture.eavesdropper` feeds what
arrives to the transcript and the live replay (``nlagg eavesdrop``). The names below are
re-exported lazily (see :mod:`nlagg_node.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlagg_node.lazy import lazy_exports

if TYPE_CHECKING:
    from .eavesdropper import Eavesdropper as Eavesdropper
    from .eavesdropper import NodeView as NodeView
    from .eavesdropper import run_eavesdropper as run_eavesdropper
    from .epochconfig import EpochConfigs as EpochConfigs
    from .epochs import EpochCapture as EpochCapture
    from .epochs import run_epoch_eavesdropper as run_epoch_eavesdropper
    from .merged import MergedSubscriber as MergedSubscriber
    from .session import CaptureSession as CaptureSession

__all__, __getattr__ = lazy_exports(__name__, __file__)
