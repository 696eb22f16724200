"""secure-fl's secure-sum layer: encoding, protocols as state machines, the network, the transcript.

Never imports torch or ``secure_fl``: the dependency points one way only.
"""

from .base import Reveal, SumOutcome
from .descriptors import DESCRIPTORS, ProtocolDescriptor, descriptor
from .embedded import SecureSum, make_sum
from .encoding import PackingLayout, VectorSpec, decode_sum, decode_sum_exact, encode
from .errors import (
    AbortedError,
    AuthenticationError,
    BoundError,
    CapacityError,
    CiphertextError,
    EncodingError,
    ForeignKeyError,
    PolicyError,
    ProtocolError,
    ReplayError,
    ShareError,
    StageError,
    ThresholdError,
    WireError,
)
from .identity import Authenticator, Directory, Identity
from .network import DropoutPlan, Label, LocalNetwork, Message, Network, Replies, RunContext, drive
from .registry import PROTOCOLS
from .session import ClientEndpoint, ClientSession, RunResult, ServerSession, SumRequest
from .transcript import Exposure, Transcript, TranscriptEntry, Visibility
from .wire import SERVER

__all__ = [
    "DESCRIPTORS",
    "PROTOCOLS",
    "SERVER",
    "AbortedError",
    "AuthenticationError",
    "Authenticator",
    "BoundError",
    "CapacityError",
    "CiphertextError",
    "ClientEndpoint",
    "ClientSession",
    "Directory",
    "DropoutPlan",
    "EncodingError",
    "Exposure",
    "ForeignKeyError",
    "Identity",
    "Label",
    "LocalNetwork",
    "Message",
    "Network",
    "PackingLayout",
    "PolicyError",
    "ProtocolDescriptor",
    "ProtocolError",
    "ReplayError",
    "Replies",
    "Reveal",
    "RunContext",
    "RunResult",
    "SecureSum",
    "ServerSession",
    "ShareError",
    "StageError",
    "SumOutcome",
    "SumRequest",
    "ThresholdError",
    "Transcript",
    "TranscriptEntry",
    "VectorSpec",
    "Visibility",
    "WireError",
    "decode_sum",
    "decode_sum_exact",
    "descriptor",
    "drive",
    "encode",
    "make_sum",
]
