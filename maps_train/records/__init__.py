"""Records shared by every stage, at the bottom of the layering: questions' answers and their cost
(`answer`), the versioned teacher trace (`trace`), scoring an answer (`metrics`), and the one append-only,
resumable keyed JSONL file they are written to (`store`). Nothing here imports a pipeline stage."""

from maps_train.records.answer import COST_KEYS, ROLE_KEYS, AnswerRecord, Cost, RecordFormatError, RoleCost
from maps_train.records.metrics import score_answer
from maps_train.records.store import KeyedJsonl, read_records
from maps_train.records.trace import (
    TRACE_SCHEMA_VERSION,
    CallUsage,
    RoleCall,
    RoundRecord,
    SubQueryHits,
    TraceFormatError,
    TraceRecord,
    iter_traces,
)

__all__ = [
    "COST_KEYS", "ROLE_KEYS", "TRACE_SCHEMA_VERSION", "AnswerRecord", "CallUsage", "Cost", "KeyedJsonl",
    "RecordFormatError", "RoleCall", "RoleCost", "RoundRecord", "SubQueryHits", "TraceFormatError", "TraceRecord",
    "iter_traces", "read_records", "score_answer",
]
