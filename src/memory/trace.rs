//! An event trace of the memory pool: what was allocated and freed, when, inside which scope.
//!
//! Off by default (it costs a push per allocation); `WGRAD_TRACE=1` or
//! `Device::set_memory_trace(true)` turns it on. The trace keeps the newest `capacity` events
//! and counts the ones it dropped. `to_json` writes it for tools; the timeline example draws it.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Arc;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A tensor's block was handed out.
    Alloc,
    /// A tensor's block came back to the cache.
    Free,
    /// A device buffer (page) was created.
    PageAlloc,
    /// A device buffer (page) was released.
    PageFree,
    /// A request failed with out-of-memory.
    Oom,
    /// A named scope began (`Device::track`, layers, training steps).
    ScopeBegin,
    /// A named scope ended.
    ScopeEnd,
}

impl EventKind {
    fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::PageAlloc => "page_alloc",
            EventKind::PageFree => "page_free",
            EventKind::Oom => "oom",
            EventKind::ScopeBegin => "scope_begin",
            EventKind::ScopeEnd => "scope_end",
        }
    }
}

/// One trace event. `allocated` and `reserved` are the pool's totals after the event.
#[derive(Clone, Debug)]
pub struct Event {
    /// Microseconds since the device was created.
    pub t_us: u64,
    /// What happened.
    pub kind: EventKind,
    /// Bytes of the block or page (0 for scope events).
    pub bytes: u64,
    /// Allocated bytes after the event.
    pub allocated: u64,
    /// Reserved bytes after the event.
    pub reserved: u64,
    /// The innermost scope open at the time (or the scope's own name for scope events).
    pub scope: Option<Arc<str>>,
}

/// A bounded event log.
#[derive(Debug)]
pub struct Trace {
    pub(crate) enabled: bool,
    capacity: usize,
    events: VecDeque<Event>,
    dropped: u64,
}

impl Trace {
    pub(crate) fn new(enabled: bool, capacity: usize) -> Self {
        Trace {
            enabled,
            capacity,
            events: VecDeque::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, e: Event) {
        if !self.enabled {
            return;
        }
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(e);
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.iter().cloned().collect()
    }

    pub(crate) fn clear(&mut self) {
        self.events.clear();
        self.dropped = 0;
    }

    /// The trace as JSON: `{"dropped": n, "events": [{"t_us":..,"kind":"alloc",...}, ...]}`.
    pub(crate) fn to_json(&self) -> String {
        let mut s = String::with_capacity(64 + self.events.len() * 96);
        let _ = write!(s, "{{\"dropped\":{},\"events\":[", self.dropped);
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"t_us\":{},\"kind\":\"{}\",\"bytes\":{},\"allocated\":{},\"reserved\":{}",
                e.t_us,
                e.kind.name(),
                e.bytes,
                e.allocated,
                e.reserved
            );
            if let Some(scope) = &e.scope {
                s.push_str(",\"scope\":");
                json_string(&mut s, scope);
            }
            s.push('}');
        }
        s.push_str("]}");
        s
    }
}

/// Appends `v` as a JSON string literal.
pub(crate) fn json_string(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_json() {
        let mut t = Trace::new(true, 2);
        for i in 0..3 {
            t.push(Event {
                t_us: i,
                kind: EventKind::Alloc,
                bytes: 256,
                allocated: 256 * (i + 1),
                reserved: 1 << 21,
                scope: Some("step \"1\"".into()),
            });
        }
        let j = t.to_json();
        assert!(j.starts_with("{\"dropped\":1,"), "{j}");
        assert!(j.contains("\"t_us\":2") && !j.contains("\"t_us\":0"), "{j}");
        assert!(j.contains("\"scope\":\"step \\\"1\\\"\""), "{j}");
    }
}
