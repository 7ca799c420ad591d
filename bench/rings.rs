//! Ring benchmark: trigd's slot round trip (source -> worker ring, worker -> return ring)
//! through `ringbuf` (what `src/ring.rs` uses) and through `rtrb`, on the same workload, in
//! one run, alternating, so the ratio is meaningful even on a busy machine.
//!
//! `cargo bench --bench rings`

use std::time::Instant;

use ringbuf::traits::{Consumer, Producer, Split};

struct Slot {
    bytes: Vec<u8>,
    arrival: Instant,
}

const N: u64 = 2_000_000;
const POOL: usize = 1024;

fn spin_push<T>(mut item: T, mut push: impl FnMut(T) -> Result<(), T>) {
    loop {
        match push(item) {
            Ok(()) => return,
            Err(back) => {
                item = back;
                std::hint::spin_loop();
            }
        }
    }
}

/// Returns (frames/s, mean one-way latency ns).
fn run_ringbuf() -> (f64, f64) {
    let (mut work_tx, mut work_rx) = ringbuf::HeapRb::<Box<Slot>>::new(POOL).split();
    let (mut free_tx, mut free_rx) = ringbuf::HeapRb::<Box<Slot>>::new(POOL).split();
    for _ in 0..POOL {
        let _ = free_tx.try_push(Box::new(Slot {
            bytes: Vec::with_capacity(128),
            arrival: Instant::now(),
        }));
    }
    let start = Instant::now();
    let consumer = std::thread::spawn(move || {
        let mut lat = 0u128;
        let mut n = 0u64;
        while n < N {
            if let Some(s) = work_rx.try_pop() {
                lat += s.arrival.elapsed().as_nanos();
                n += 1;
                spin_push(s, |x| free_tx.try_push(x));
            } else {
                std::hint::spin_loop();
            }
        }
        lat
    });
    let payload = [7u8; 100];
    let mut sent = 0u64;
    while sent < N {
        if let Some(mut s) = free_rx.try_pop() {
            s.bytes.clear();
            s.bytes.extend_from_slice(&payload);
            s.arrival = Instant::now();
            spin_push(s, |x| work_tx.try_push(x));
            sent += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    let lat = consumer.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    (N as f64 / secs, lat as f64 / N as f64)
}

fn run_rtrb() -> (f64, f64) {
    let (mut work_tx, mut work_rx) = rtrb::RingBuffer::<Box<Slot>>::new(POOL);
    let (mut free_tx, mut free_rx) = rtrb::RingBuffer::<Box<Slot>>::new(POOL);
    for _ in 0..POOL {
        let _ = free_tx.push(Box::new(Slot {
            bytes: Vec::with_capacity(128),
            arrival: Instant::now(),
        }));
    }
    let start = Instant::now();
    let consumer = std::thread::spawn(move || {
        let mut lat = 0u128;
        let mut n = 0u64;
        while n < N {
            if let Ok(s) = work_rx.pop() {
                lat += s.arrival.elapsed().as_nanos();
                n += 1;
                spin_push(s, |x| free_tx.push(x).map_err(|rtrb::PushError::Full(v)| v));
            } else {
                std::hint::spin_loop();
            }
        }
        lat
    });
    let payload = [7u8; 100];
    let mut sent = 0u64;
    while sent < N {
        if let Ok(mut s) = free_rx.pop() {
            s.bytes.clear();
            s.bytes.extend_from_slice(&payload);
            s.arrival = Instant::now();
            spin_push(s, |x| work_tx.push(x).map_err(|rtrb::PushError::Full(v)| v));
            sent += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    let lat = consumer.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    (N as f64 / secs, lat as f64 / N as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds = 7;
    let (mut rb_rate, mut rb_lat, mut rt_rate, mut rt_lat) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (r, l) = run_ringbuf();
        rb_rate.push(r);
        rb_lat.push(l);
        let (r, l) = run_rtrb();
        rt_rate.push(r);
        rt_lat.push(l);
    }
    println!("slot round trip, {N} frames of 100 bytes, pool {POOL}, median of {rounds} alternating rounds");
    println!("| ring | frames/s | mean queue latency (ns) |");
    println!("|---|---|---|");
    println!(
        "| ringbuf 0.4 | {:.0} | {:.0} |",
        median(rb_rate.clone()),
        median(rb_lat)
    );
    println!(
        "| rtrb 0.3 | {:.0} | {:.0} |",
        median(rt_rate.clone()),
        median(rt_lat)
    );
    println!(
        "ringbuf/rtrb throughput ratio: {:.2}",
        median(rb_rate) / median(rt_rate)
    );
}
