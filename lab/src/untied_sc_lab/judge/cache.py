"""An append-only on-disk cache of judge replies, keyed by the request: an answered prompt is never asked again.

The cache is a JSONL file; each line is `{"key", "id", "reply", "reasoning", "usage", "finish_reason"}`, where `key`
is the SHA-256 of the request body (model, messages, options; not the endpoint or the API key). A line is written and
flushed to disk as soon as its reply arrives, so an interrupted run loses nothing; a torn last line is skipped when
read.
"""

import hashlib
import json
import os
import threading
from pathlib import Path

from ..record_fields import RecordError
from .records import CachedReply, ChatReply


def request_key(body: dict) -> str:
    """The cache key of a request body: SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class ReplyCache:
    """Replies by request key, read from and appended to `path` (thread-safe appends)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.replies: dict[str, ChatReply] = {}
        self.skipped_lines = 0
        self._lock = threading.Lock()
        if self.path.exists():
            with self.path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    try:
                        entry = CachedReply.from_json(json.loads(line), f"{self.path}, line {number}")
                    except (json.JSONDecodeError, RecordError):
                        self.skipped_lines += 1  # a line torn by an interruption
                        continue
                    self.replies[entry.key] = entry.reply

    def __contains__(self, key: str) -> bool:
        return key in self.replies

    def __len__(self) -> int:
        return len(self.replies)

    def get(self, key: str) -> ChatReply | None:
        return self.replies.get(key)

    def add(self, key: str, reply: ChatReply, presentation_id: str | None = None) -> None:
        """Stores `reply` under `key` and appends it to the file (flushed and synced before returning)."""
        line = json.dumps(CachedReply(key, presentation_id, reply).to_json(), ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                if handle.tell() > 0 and not self._ends_with_newline():
                    handle.write("\n")  # after a torn line: start a fresh one
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            self.replies[key] = reply

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
