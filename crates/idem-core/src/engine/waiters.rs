//! In-process waiting for an in-flight key (the `wait` policy).
//!
//! When the executor of a key runs in this process, a duplicate waits on a [`Notify`] that the
//! executor fires when it is done, so it wakes the moment the result is stored, without
//! polling. When the executor is elsewhere (another gateway instance), nothing here will fire,
//! and the waiter polls the store instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::key::Key;
use crate::scope::Scope;
use tokio::sync::Notify;

/// Keys executing in this process, and who waits for them.
#[derive(Debug, Default)]
pub struct Waiters {
    running: Mutex<HashMap<(Scope, Key), Arc<Notify>>>,
}

impl Waiters {
    /// Registers an execution; the returned guard wakes every waiter when dropped, whether the
    /// execution finished, failed or was cancelled.
    pub fn executing(self: &Arc<Self>, scope: &Scope, key: &Key) -> Running {
        let notify = Arc::new(Notify::new());
        self.lock()
            .insert((scope.clone(), key.clone()), notify.clone());
        Running {
            waiters: self.clone(),
            id: (scope.clone(), key.clone()),
            notify,
        }
    }

    /// The execution of (scope, key) in this process, if there is one.
    pub fn get(&self, scope: &Scope, key: &Key) -> Option<Arc<Notify>> {
        self.lock().get(&(scope.clone(), key.clone())).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Scope, Key), Arc<Notify>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An execution in progress; see [`Waiters::executing`].
#[derive(Debug)]
pub struct Running {
    waiters: Arc<Waiters>,
    id: (Scope, Key),
    notify: Arc<Notify>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.waiters.lock();
        if running
            .get(&self.id)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            running.remove(&self.id);
        }
        drop(running);
        self.notify.notify_waiters();
    }
}
