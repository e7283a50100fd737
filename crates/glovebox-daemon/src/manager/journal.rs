//! The durable side of a sandbox's life, as an observer of the manager: its store record,
//! its `created` and `ended` events and its metered usage, each change in one transaction.

use std::sync::Arc;
use std::time::SystemTime;

use glovebox_proto::api::{EndReason, EventKind};

use crate::events::Events;
use crate::manager::{Announce, Observer, Sb};
use crate::store::{SandboxRecord, State, Store};
use crate::usage::Ledger;

pub struct Journal {
    pub store: Arc<Store>,
    pub events: Arc<Events>,
    pub ended_usage: Arc<Ledger>,
}

impl Journal {
    /// Publishes a stored event once the announcement runs; a failed store only logs.
    fn announce(&self, id: &str, what: &str, stored: rusqlite::Result<crate::store::EventRecord>) -> Option<Announce> {
        match stored {
            Ok(e) => {
                let events = self.events.clone();
                Some(Box::new(move || events.published(&e)))
            }
            Err(e) => {
                tracing::error!(sandbox = %id, "{what}: {e}");
                None
            }
        }
    }
}

impl Observer for Journal {
    /// Stored before it is listed, so a destroy racing the answer always finds the record to
    /// end; followers hear of the event once it is listed.
    fn created(&self, sb: &Sb) -> Option<Announce> {
        let rec = SandboxRecord {
            id: sb.id.clone(),
            template: sb.template.clone(),
            config: sb.config(),
            created_at: sb.created_at,
            deadline: sb.deadline().wall,
            slot: sb.slot(),
            pid: sb.pid,
            pid_start: sb.pid_start,
            state: State::Running,
            end_reason: None,
            ended_at: None,
        };
        let stored = self.store.transaction(|c| {
            crate::store::put_sandbox_on(c, &rec)?;
            Events::add_on(c, &sb.id, EventKind::Created, None, None)
        });
        self.announce(&sb.id, "store sandbox", stored)
    }

    /// Its usage, end state and `ended` event: one transaction, one commit.
    fn ended(&self, sb: &Sb, reason: EndReason, detail: Option<&str>) -> Option<Announce> {
        let usage = sb.usage();
        let stored = self.ended_usage.record_with(usage, |usage| {
            self.store.transaction(|c| {
                crate::usage::persist_on(c, usage)?;
                crate::store::end_sandbox_on(c, &sb.id, reason, SystemTime::now())?;
                Events::add_on(c, &sb.id, EventKind::Ended, Some(reason), detail)
            })
        });
        self.announce(&sb.id, "store end", stored)
    }
}
