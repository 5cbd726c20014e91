//! What one Produce costs the proxy's Produce path when its caches are
//! cold, phase by phase, as a link and as a local client.
//!
//! The end-to-end runs (`scripts/perf.sh`) put the link's excess over
//! passthrough at about 6 us a request, while criterion, which runs every
//! phase hot, puts the same work under 2 us. Between two requests the
//! broker and the producer run on the same two cores and evict the proxy's
//! data, so this runs each request after writing `SCRUB_MIB` of memory
//! (default 4 MiB: twice the cores' own caches; 96 MiB: past the shared
//! last-level cache and the TLBs' reach too), and once hot for comparison.
//!
//! Phases of a 16 KiB v13 request of one partition, one batch, a known
//! origin, as the Produce path runs them, with the allocations each makes:
//! - link: `plan` (request walk, topic and origin lookups, patch plan),
//!   `apply` (the 8-byte patch), `begin` (producer state), `answers` (the
//!   response walk with the answers visitor), `settle` (producer state);
//! - local: `any_topic` (the read-only check: index and ask), `response_walk` (the
//!   response walk alone).
//!
//! `cargo run --release --example cold_cost [ITERATIONS]`
//! `SCRUB_MIB=96 cargo run --release --example cold_cost`

use std::hint::black_box;
use std::time::Instant;

use kafka_mirror_proxy::benching::ColdCost;

/// Counts allocations, to report how many each phase makes.
struct Counting;
static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;
fn allocations() -> u64 {
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Requests run before any is measured.
const WARM_UP: usize = 20;
const PHASES: usize = ColdCost::PHASES.len();

/// Write `buf`, evicting the proxy's data as the broker and the producer
/// do between two requests.
fn scrub(buf: &mut [u8], round: u8) {
    for chunk in buf.chunks_mut(64) {
        chunk[0] = chunk[0].wrapping_add(round);
    }
    black_box(&buf[..]);
}

/// Times `f` and counts its allocations into `at` of `t` and `a`.
fn measure(t: &mut [u64], a: &mut [u64], at: usize, f: &mut dyn FnMut()) {
    let (start, allocated) = (Instant::now(), allocations());
    f();
    t[at] = start.elapsed().as_nanos() as u64;
    a[at] = allocations() - allocated;
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let cost = ColdCost::new();
    let scrub_mib: usize = std::env::var("SCRUB_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut scrub_buf = vec![0u8; scrub_mib << 20];
    let mut n = 0usize;
    for cold in [false, true] {
        let mut times: Vec<[u64; PHASES]> = Vec::with_capacity(iterations);
        let mut allocs = [0u64; PHASES];
        for i in 0..iterations + WARM_UP {
            // Every request carries new sequences and gets new offsets.
            n += 1;
            let (mut t, mut a) = ([0u64; PHASES], [0u64; PHASES]);
            if cold {
                scrub(&mut scrub_buf, n as u8);
            }
            cost.request(n, &mut |k, work| {
                // The local path's phases come after the link's, with the
                // caches written over again in between.
                if cold && k == ColdCost::LINK_PHASES {
                    scrub(&mut scrub_buf, n as u8);
                }
                measure(&mut t, &mut a, k, work)
            });
            if i >= WARM_UP {
                times.push(t);
                for (sum, one) in allocs.iter_mut().zip(a) {
                    *sum += one;
                }
            }
        }
        match cold {
            false => println!("hot, {iterations} requests: ns, median (mean); allocations"),
            true => println!(
                "after writing {scrub_mib} MiB, {iterations} requests: ns, median (mean); allocations"
            ),
        }
        let mut totals = [0u64; 2];
        for (k, name) in ColdCost::PHASES.iter().enumerate() {
            let mut v: Vec<u64> = times.iter().map(|s| s[k]).collect();
            v.sort_unstable();
            let mean = v.iter().sum::<u64>() / v.len() as u64;
            let per_request = allocs[k] as f64 / iterations as f64;
            println!(
                "  {name:<14} {:>7} ({mean:>6}) {per_request:.0}",
                v[v.len() / 2]
            );
            totals[usize::from(k >= ColdCost::LINK_PHASES)] += mean;
        }
        println!("  link, summed means:  {:>6}", totals[0]);
        println!("  local, summed means: {:>6}", totals[1]);
    }
}
