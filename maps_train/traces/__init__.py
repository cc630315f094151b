"""Teacher traces: the versioned record of every role call (`schema`), the append-only resumable writer and
reader (`writer`), and the per-role SFT sets built from them."""

from maps_train.traces.schema import (
    TRACE_SCHEMA_VERSION,
    CallUsage,
    RoleCall,
    RoundRecord,
    SubQueryHits,
    TraceFormatError,
    TraceRecord,
)
from maps_train.traces.writer import KeyedJsonl, iter_traces

__all__ = [
    "TRACE_SCHEMA_VERSION",
    "CallUsage",
    "KeyedJsonl",
    "RoleCall",
    "RoundRecord",
    "SubQueryHits",
    "TraceFormatError",
    "TraceRecord",
    "iter_traces",
]
