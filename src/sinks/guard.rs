//! A sink behind its failure policy. [`GuardedSink`] counts every write and flush error
//! (`trigd_sink_errors_total{sink,kind}`), logs each failure episode once when it starts
//! (with the path and the OS error) and once when it ends, and says what happens to the
//! decisions the sink cannot take ([`SinkPolicy`]):
//!
//! - `block`: decisions wait in a backlog allocated at start-up, in order; while the sink
//!   fails the decision thread stops taking reconstructed frames, so the inputs' rings fill
//!   and new frames are dropped with reason `sink_blocked` (counted, and still recorded once
//!   the sink works again). The sink is retried every `retry`; a backlog that overflows, or
//!   a sink still failing at shutdown, loses decisions, counted.
//! - `spill`: decisions go to a second sink while the first fails; the first is retried and
//!   takes over again once it works. The records the first still held in its buffer when it
//!   failed are spilled too, so a record can appear in both files if the first later
//!   manages to write its buffer: `(source, source_id, seq)` tells them apart.
//! - `drop`: the decision is counted as lost; best effort (the UDP decision stream).
//!
//! A record counts as written once its bytes reached the OS: records buffered since the
//! last successful flush are lost if the final flush fails.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use super::{Sink, SinkPolicy};
use crate::decision::{Decision, Names};
use crate::pipeline::Observe;

/// How long a best-effort sink must go without an error before its episode ends.
pub const QUIET_FOR_RECOVERY: Duration = Duration::from_secs(1);

/// Settings shared by the guarded sinks.
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    /// Decisions a blocked sink holds (allocated at start-up).
    pub backlog: usize,
    /// How often a failing sink is tried again.
    pub retry: Duration,
    /// Longest the inputs are paused for one blocked sink; `None`: until it recovers or the
    /// daemon stops. Afterwards the backlog still fills, then decisions are lost.
    pub block_max: Option<Duration>,
}

impl Default for GuardSettings {
    fn default() -> Self {
        Self {
            backlog: 65536,
            retry: Duration::from_millis(100),
            block_max: Some(Duration::from_secs(30)),
        }
    }
}

/// What one sink did over a run.
#[derive(Debug, Clone, Default)]
pub struct SinkTotals {
    pub kind: &'static str,
    pub target: String,
    pub policy: Option<SinkPolicy>,
    /// Write and flush errors.
    pub errors: u64,
    /// Decisions neither written nor spilled.
    pub lost: u64,
    /// Decisions written to the spill sink instead.
    pub spilled: u64,
    /// Failure episodes (each logged once).
    pub episodes: u64,
}

impl SinkTotals {
    /// Lost decisions that count against the run (not a best-effort sink's).
    pub fn undelivered(&self) -> u64 {
        match self.policy {
            Some(SinkPolicy::Drop) => 0,
            _ => self.lost,
        }
    }
}

/// One failure episode: logged when it starts and when it ends.
#[derive(Debug, Default)]
pub struct Episode {
    since: Option<Instant>,
    last_error: Option<Instant>,
    errors: u64,
    lost_at_start: u64,
}

impl Episode {
    /// Notes an error; returns true if it starts an episode (the caller logs it).
    pub fn error(&mut self, now: Instant, lost: u64) -> bool {
        self.last_error = Some(now);
        self.errors += 1;
        if self.since.is_none() {
            self.since = Some(now);
            self.errors = 1;
            self.lost_at_start = lost;
            return true;
        }
        false
    }
    pub fn active(&self) -> bool {
        self.since.is_some()
    }
    pub fn since(&self) -> Option<Instant> {
        self.since
    }
    /// Ends the episode if one is active and the last error is `quiet` old; returns
    /// (errors, decisions lost during it) to log.
    pub fn end(&mut self, now: Instant, quiet: Duration, lost: u64) -> Option<(u64, u64)> {
        let last = self.last_error?;
        if now.saturating_duration_since(last) < quiet {
            return None;
        }
        self.since = None;
        self.last_error = None;
        Some((self.errors, lost - self.lost_at_start))
    }
}

/// A sink, its spill sink, its policy and its failure state.
pub struct GuardedSink {
    sink: Box<dyn Sink>,
    spill: Option<Box<dyn Sink>>,
    policy: SinkPolicy,
    settings: GuardSettings,
    backlog: VecDeque<Decision>,
    /// Spill: copies of the records taken since the last successful flush, spilled if the
    /// flush fails (bounded like the backlog).
    recent: VecDeque<Decision>,
    /// Records taken by the sink since its last successful flush.
    unflushed: u64,
    spill_unflushed: u64,
    /// The sink failed and has not taken everything back yet (block, spill).
    broken: bool,
    last_retry: Instant,
    episode: Episode,
    totals: SinkTotals,
}

impl GuardedSink {
    /// `spill` is used only by [`SinkPolicy::Spill`]. The backlog is allocated now for
    /// [`SinkPolicy::Block`].
    pub fn new(
        sink: Box<dyn Sink>,
        policy: SinkPolicy,
        spill: Option<Box<dyn Sink>>,
        settings: GuardSettings,
    ) -> Self {
        let backlog = if policy == SinkPolicy::Block {
            VecDeque::with_capacity(settings.backlog)
        } else {
            VecDeque::new()
        };
        let recent = if policy == SinkPolicy::Spill {
            VecDeque::with_capacity(settings.backlog)
        } else {
            VecDeque::new()
        };
        let totals = SinkTotals {
            kind: sink.kind(),
            target: sink.target(),
            policy: Some(policy),
            ..Default::default()
        };
        Self {
            sink,
            spill,
            policy,
            settings,
            backlog,
            recent,
            unflushed: 0,
            spill_unflushed: 0,
            broken: false,
            last_retry: Instant::now(),
            episode: Episode::default(),
            totals,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.totals.kind
    }

    /// In a failure episode (for `/readyz`).
    pub fn failing(&self) -> bool {
        self.episode.active()
    }

    /// The inputs must wait for this sink: it blocks and has not been blocking for longer
    /// than `block_max`.
    pub fn pauses(&self, now: Instant) -> bool {
        self.policy == SinkPolicy::Block
            && self.broken
            && match (self.settings.block_max, self.episode.since()) {
                (Some(max), Some(since)) => now.saturating_duration_since(since) < max,
                _ => true,
            }
    }

    /// Every decision taken so far is written and flushed (or, for a best-effort sink,
    /// written or counted lost): nothing waits in a backlog or a buffer. What the decision
    /// thread checks before it acknowledges frames to a farm's work queue.
    pub fn all_written(&self) -> bool {
        !(self.broken && self.policy == SinkPolicy::Block)
            && self.unflushed == 0
            && self.spill_unflushed == 0
            && self.backlog.is_empty()
    }

    pub fn totals(&self) -> &SinkTotals {
        &self.totals
    }

    fn error(&mut self, e: &io::Error, what: &str, obs: &dyn Observe) {
        self.totals.errors += 1;
        obs.sink_error(self.totals.kind, e);
        if self.episode.error(Instant::now(), self.totals.lost) {
            self.totals.episodes += 1;
            let then = match self.policy {
                SinkPolicy::Block => "decisions wait in the backlog and the inputs pause",
                SinkPolicy::Spill => "decisions go to the spill path",
                SinkPolicy::Drop => "decisions to this sink are counted as lost",
            };
            tracing::error!(
                sink = self.totals.kind,
                target = %self.totals.target,
                policy = self.policy.as_str(),
                "decision sink {} failed to {what}: {e}; {then} until it works again",
                self.totals.target
            );
        }
    }

    fn lose(&mut self, n: u64, obs: &dyn Observe) {
        if n > 0 {
            self.totals.lost += n;
            obs.sink_lost(self.totals.kind, n);
        }
    }

    fn end_episode(&mut self, quiet: Duration) {
        if let Some((errors, lost)) = self.episode.end(Instant::now(), quiet, self.totals.lost) {
            tracing::warn!(
                sink = self.totals.kind,
                target = %self.totals.target,
                "decision sink {} works again after {errors} errors; {lost} decisions lost meanwhile",
                self.totals.target
            );
        }
    }

    fn spill_one(&mut self, d: &Decision, names: &Names, obs: &dyn Observe) {
        let r = match self.spill.as_mut() {
            Some(s) => s.write(d, names),
            None => Err(io::Error::other("no spill path configured")),
        };
        match r {
            Ok(()) => {
                self.spill_unflushed += 1;
                self.totals.spilled += 1;
            }
            Err(e) => {
                self.totals.errors += 1;
                obs.sink_error(self.totals.kind, &e);
                if self.totals.lost == 0 {
                    tracing::error!(
                        sink = self.totals.kind,
                        "the spill path of {} fails too: {e}; decisions are lost",
                        self.totals.target
                    );
                }
                self.lose(1, obs);
            }
        }
    }

    /// Spill: the records the failed sink still holds unflushed go to the spill sink.
    fn spill_recent(&mut self, names: &Names, obs: &dyn Observe) {
        let recent = std::mem::take(&mut self.recent);
        for d in &recent {
            self.spill_one(d, names, obs);
        }
        // Those the copy could not hold (more than the backlog since the last flush).
        let uncopied = self.unflushed.saturating_sub(recent.len() as u64);
        self.lose(uncopied, obs);
        self.unflushed = 0;
        self.recent = recent;
        self.recent.clear();
    }

    /// The sink cannot take `d`: do what the policy says.
    fn divert(&mut self, d: &Decision, names: &Names, obs: &dyn Observe) {
        match self.policy {
            SinkPolicy::Block => {
                if self.backlog.len() < self.settings.backlog {
                    self.backlog.push_back(d.clone());
                } else {
                    self.lose(1, obs);
                }
            }
            SinkPolicy::Spill => self.spill_one(d, names, obs),
            SinkPolicy::Drop => self.lose(1, obs),
        }
    }

    /// Hands one decision to the sink, or to its policy if the sink fails.
    pub fn deliver(&mut self, d: &Decision, names: &Names, obs: &dyn Observe) {
        if self.broken {
            self.divert(d, names, obs);
            return;
        }
        match self.sink.write(d, names) {
            Ok(()) => {
                self.unflushed += 1;
                if self.policy == SinkPolicy::Spill && self.recent.len() < self.settings.backlog {
                    self.recent.push_back(d.clone());
                }
                if self.episode.active() {
                    self.end_episode(QUIET_FOR_RECOVERY);
                }
            }
            Err(e) => {
                self.error(&e, "write", obs);
                self.broken = self.policy != SinkPolicy::Drop;
                if self.policy == SinkPolicy::Spill {
                    self.spill_recent(names, obs);
                }
                self.divert(d, names, obs);
            }
        }
    }

    /// Flushes the sink (end of a batch); a failure starts the policy.
    pub fn flush(&mut self, names: &Names, obs: &dyn Observe) {
        if self.spill_unflushed > 0 {
            if let Some(s) = self.spill.as_mut() {
                match s.flush() {
                    Ok(()) => self.spill_unflushed = 0,
                    Err(e) => {
                        self.totals.errors += 1;
                        obs.sink_error(self.totals.kind, &e);
                    }
                }
            }
        }
        if self.broken {
            return;
        }
        match self.sink.flush() {
            Ok(()) => {
                self.unflushed = 0;
                self.recent.clear();
            }
            Err(e) => {
                self.error(&e, "flush", obs);
                self.broken = self.policy != SinkPolicy::Drop;
                match self.policy {
                    SinkPolicy::Drop => {
                        let n = std::mem::take(&mut self.unflushed);
                        self.lose(n, obs);
                    }
                    SinkPolicy::Spill => self.spill_recent(names, obs),
                    SinkPolicy::Block => {}
                }
            }
        }
    }

    /// Tries a failing sink again if `retry` has passed since the last try (or `force`):
    /// flush what it holds, then the backlog in order. Returns whether it works again.
    pub fn retry(&mut self, names: &Names, obs: &dyn Observe, force: bool) -> bool {
        if !self.broken {
            return true;
        }
        let now = Instant::now();
        if !force && now.saturating_duration_since(self.last_retry) < self.settings.retry {
            return false;
        }
        self.last_retry = now;
        if let Err(e) = self.sink.flush() {
            self.error(&e, "flush", obs);
            return false;
        }
        self.unflushed = 0;
        while let Some(d) = self.backlog.front() {
            match self.sink.write(d, names) {
                Ok(()) => {
                    self.unflushed += 1;
                    self.backlog.pop_front();
                }
                Err(e) => {
                    self.error(&e, "write", obs);
                    return false;
                }
            }
        }
        if let Err(e) = self.sink.flush() {
            self.error(&e, "flush", obs);
            return false;
        }
        self.unflushed = 0;
        self.broken = false;
        self.end_episode(Duration::ZERO);
        true
    }

    /// SIGHUP: reopen the sink (and the spill sink). A sink that fails to reopen fails.
    pub fn reopen(&mut self, obs: &dyn Observe) {
        if let Some(s) = self.spill.as_mut() {
            if let Err(e) = s.reopen() {
                self.totals.errors += 1;
                obs.sink_error(self.totals.kind, &e);
                tracing::error!("reopening the spill path of {}: {e}", self.totals.target);
            }
        }
        match self.sink.reopen() {
            Ok(()) => self.unflushed = 0,
            Err(e) => {
                self.error(&e, "reopen", obs);
                self.broken = self.policy != SinkPolicy::Drop;
            }
        }
    }

    /// End of the run: one last try, then whatever is still not written is lost.
    pub fn finish(&mut self, names: &Names, obs: &dyn Observe) -> SinkTotals {
        if self.broken {
            self.retry(names, obs, true);
        } else {
            self.flush(names, obs);
            if self.broken {
                self.retry(names, obs, true);
            }
        }
        if self.broken {
            let n = self.backlog.len() as u64 + self.unflushed;
            self.backlog.clear();
            self.unflushed = 0;
            self.lose(n, obs);
        }
        if self.spill_unflushed > 0 {
            self.flush(names, obs);
            let n = std::mem::take(&mut self.spill_unflushed);
            self.lose(n, obs);
        }
        if self.totals.lost > 0 && self.policy != SinkPolicy::Drop {
            tracing::error!(
                sink = self.totals.kind,
                target = %self.totals.target,
                lost = self.totals.lost,
                "{} decisions were not written to {}",
                self.totals.lost,
                self.totals.target
            );
        }
        self.totals.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::NoObserver;
    use crate::sinks::testdata;
    use std::sync::{Arc, Mutex};

    /// A sink that fails while `fail` is set and records what it takes.
    struct Flaky {
        fail: Arc<Mutex<bool>>,
        taken: Arc<Mutex<Vec<u64>>>,
    }
    impl Sink for Flaky {
        fn write(&mut self, d: &Decision, _: &Names) -> io::Result<()> {
            if *self.fail.lock().unwrap() {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.taken.lock().unwrap().push(d.seq);
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            if *self.fail.lock().unwrap() {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            Ok(())
        }
        fn kind(&self) -> &'static str {
            "jsonl"
        }
    }

    type Switch = Arc<Mutex<bool>>;
    type Taken = Arc<Mutex<Vec<u64>>>;

    fn flaky() -> (Flaky, Switch, Taken) {
        let fail = Arc::new(Mutex::new(false));
        let taken = Arc::new(Mutex::new(Vec::new()));
        (
            Flaky {
                fail: fail.clone(),
                taken: taken.clone(),
            },
            fail,
            taken,
        )
    }

    fn decision(seq: u64) -> Decision {
        Decision {
            seq,
            ..testdata::decisions()[0].clone()
        }
    }

    #[test]
    fn block_keeps_order_through_a_failure_and_loses_nothing() {
        let names = testdata::names();
        let (s, fail, taken) = flaky();
        let settings = GuardSettings {
            backlog: 100,
            retry: Duration::ZERO,
            block_max: None,
        };
        let mut g = GuardedSink::new(Box::new(s), SinkPolicy::Block, None, settings);
        for seq in 0..10 {
            g.deliver(&decision(seq), &names, &NoObserver);
        }
        *fail.lock().unwrap() = true;
        for seq in 10..20 {
            g.deliver(&decision(seq), &names, &NoObserver);
        }
        assert!(g.failing() && g.pauses(Instant::now()));
        assert!(!g.retry(&names, &NoObserver, true));
        *fail.lock().unwrap() = false;
        assert!(g.retry(&names, &NoObserver, true));
        assert!(!g.failing() && !g.pauses(Instant::now()));
        for seq in 20..25 {
            g.deliver(&decision(seq), &names, &NoObserver);
        }
        let t = g.finish(&names, &NoObserver);
        assert_eq!(*taken.lock().unwrap(), (0..25).collect::<Vec<_>>());
        assert_eq!((t.lost, t.episodes), (0, 1));
        assert_eq!(t.errors, 2, "the first failed write and the failed retry");
    }

    #[test]
    fn block_counts_what_overflows_the_backlog_and_what_is_left_at_the_end() {
        let names = testdata::names();
        let (s, fail, _) = flaky();
        *fail.lock().unwrap() = true;
        let settings = GuardSettings {
            backlog: 5,
            retry: Duration::ZERO,
            block_max: Some(Duration::ZERO),
        };
        let mut g = GuardedSink::new(Box::new(s), SinkPolicy::Block, None, settings);
        for seq in 0..12 {
            g.deliver(&decision(seq), &names, &NoObserver);
        }
        assert!(!g.pauses(Instant::now()), "block_max 0 never pauses");
        let t = g.finish(&names, &NoObserver);
        assert_eq!(t.lost, 12);
        assert_eq!(t.undelivered(), 12);
    }

    #[test]
    fn spill_takes_over_and_hands_back() {
        let names = testdata::names();
        let (s, fail, taken) = flaky();
        let (spill, _, spilled) = flaky();
        let mut g = GuardedSink::new(
            Box::new(s),
            SinkPolicy::Spill,
            Some(Box::new(spill)),
            GuardSettings {
                retry: Duration::ZERO,
                ..Default::default()
            },
        );
        g.deliver(&decision(0), &names, &NoObserver);
        g.flush(&names, &NoObserver);
        g.deliver(&decision(1), &names, &NoObserver);
        *fail.lock().unwrap() = true;
        // The flush fails: decision 1, taken but not flushed, is spilled too.
        g.flush(&names, &NoObserver);
        g.deliver(&decision(2), &names, &NoObserver);
        assert!(!g.pauses(Instant::now()), "spill never pauses");
        *fail.lock().unwrap() = false;
        assert!(g.retry(&names, &NoObserver, true));
        g.deliver(&decision(3), &names, &NoObserver);
        let t = g.finish(&names, &NoObserver);
        assert_eq!(*taken.lock().unwrap(), vec![0, 1, 3]);
        assert_eq!(*spilled.lock().unwrap(), vec![1, 2]);
        assert_eq!((t.lost, t.spilled), (0, 2));
    }

    #[test]
    fn drop_counts_losses_without_failing_the_run() {
        let names = testdata::names();
        let (s, fail, taken) = flaky();
        let mut g = GuardedSink::new(
            Box::new(s),
            SinkPolicy::Drop,
            None,
            GuardSettings::default(),
        );
        *fail.lock().unwrap() = true;
        for seq in 0..4 {
            g.deliver(&decision(seq), &names, &NoObserver);
        }
        assert!(g.failing());
        *fail.lock().unwrap() = false;
        g.deliver(&decision(4), &names, &NoObserver);
        assert!(g.failing(), "still failing within the quiet period");
        let t = g.finish(&names, &NoObserver);
        assert_eq!(*taken.lock().unwrap(), vec![4]);
        assert_eq!(
            (t.lost, t.undelivered(), t.errors, t.episodes),
            (4, 0, 4, 1)
        );
    }
}
