//! Event simulation with truth: particles from a thin fixed target, transported through the
//! detector's field with a 4th-order Runge-Kutta in the (x, y, tx, ty, q/p) form with z as
//! the free variable, multiple scattering at every plane (Highland), hit smearing, plane
//! inefficiency, acceptance and noise hits.
//!
//! Physics choices (documented here because evaluation numbers depend on them):
//! - Production: a Poisson number of charged hadrons per event; species 80 % pions, 10 %
//!   kaons, 10 % protons (pions and kaons of either charge, protons positive); transverse
//!   momentum from `pT exp(-pT / T)` (a Gamma(2, T) law, mean `2T`), rapidity Gaussian
//!   around the centre-of-mass rapidity of a ~100 GeV proton beam on a fixed target
//!   (`y ~ 2.8`, width 1.2), uniform azimuth. This gives tracks from a few hundred MeV/c
//!   to tens of GeV/c in the acceptance, below and above 1 GeV/c.
//! - Vertex: Gaussian beam spot in x and y, uniform in z over the target thickness.
//! - Transport: RK4 in steps of at most `max_step_mm`, ending exactly on each plane. A
//!   particle whose slope exceeds [`MAX_SLOPE`] (curling in the field) is stopped. No
//!   energy loss (thin silicon: a few MeV per plane, below the momentum resolution).
//! - Material: where a particle crosses a plane's sensitive area it is scattered by two
//!   independent Gaussian projected angles of width θ0 (Highland, PDG eq. 34.15) for the
//!   path length `x0_fraction * sqrt(1 + tx^2 + ty^2)`. Outside the sensitive area a plane
//!   has no material and gives no hit.
//! - Truth at a hit: the true crossing point on the plane and the momentum just after the
//!   plane's scattering (what the downstream hits measure, so what a fit that ends at the
//!   most upstream hit estimates).
//! - Truth weight (TrackML `weight`): uniform over the hits of particles that leave hits on
//!   at least [`RECONSTRUCTABLE_MIN_PLANES`] planes, normalised to a sum of 1 per event;
//!   zero for noise hits and other particles' hits.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma, Normal, Poisson};

use super::geometry::{Detector, Field, Plane};
use crate::frame::{self, HitRecord, Stamp};

/// Curvature constant: `c` in GeV / (T mm) for unit charge (`1/R[mm] = KAPPA * B[T] / pT[GeV]`).
pub const KAPPA_GEV_PER_T_MM: f64 = 0.299_792_458e-3;
/// Transport stops when |tx| or |ty| exceeds this (about 79 degrees from the z axis).
pub const MAX_SLOPE: f64 = 5.0;
/// A particle is reconstructable (and weighted) with hits on at least this many planes.
pub const RECONSTRUCTABLE_MIN_PLANES: usize = 4;

const PION_MASS_GEV: f64 = 0.139_570_39;
const KAON_MASS_GEV: f64 = 0.493_677;
const PROTON_MASS_GEV: f64 = 0.938_272_088;

/// Track parameters at a given z, double precision: the truth side's state vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateVector {
    pub z_mm: f64,
    pub x_mm: f64,
    pub y_mm: f64,
    /// dx/dz
    pub tx: f64,
    /// dy/dz
    pub ty: f64,
    /// charge over momentum, e/(GeV/c)
    pub qop: f64,
}

impl StateVector {
    /// State of a particle at `pos_mm` with momentum `p_gev` (must go forward, pz > 0).
    pub fn from_momentum(pos_mm: [f64; 3], p_gev: [f64; 3], q: f64) -> Self {
        let p = (p_gev[0] * p_gev[0] + p_gev[1] * p_gev[1] + p_gev[2] * p_gev[2]).sqrt();
        StateVector {
            z_mm: pos_mm[2],
            x_mm: pos_mm[0],
            y_mm: pos_mm[1],
            tx: p_gev[0] / p_gev[2],
            ty: p_gev[1] / p_gev[2],
            qop: q / p,
        }
    }
    /// Momentum vector, GeV/c (forward-going).
    pub fn momentum_gev(&self) -> [f64; 3] {
        let p = 1.0 / self.qop.abs();
        let pz = p / (1.0 + self.tx * self.tx + self.ty * self.ty).sqrt();
        [self.tx * pz, self.ty * pz, pz]
    }
}

/// Why transport stopped before the requested z.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum TransportError {
    #[error(
        "slope exceeded {MAX_SLOPE} at z = {z_mm} mm: the particle curls away from the detector"
    )]
    Curled { z_mm: f64 },
    #[error("non-finite state at z = {z_mm} mm")]
    NonFinite { z_mm: f64 },
}

#[inline]
fn derivatives(field: &Field, z_mm: f64, s: [f64; 4], qop: f64) -> [f64; 4] {
    let b = field.at([s[0], s[1], z_mm]);
    let (tx, ty) = (s[2], s[3]);
    let k = KAPPA_GEV_PER_T_MM * qop * (1.0 + tx * tx + ty * ty).sqrt();
    [
        tx,
        ty,
        k * (tx * ty * b[0] - (1.0 + tx * tx) * b[1] + ty * b[2]),
        k * ((1.0 + ty * ty) * b[0] - tx * ty * b[1] - tx * b[2]),
    ]
}

/// Transports `state` to `z_to_mm` through `field` with classical RK4 in equal steps of at
/// most `max_step_mm` (forward or backward). On error `state` holds the last good step.
pub fn propagate(
    field: &Field,
    state: &mut StateVector,
    z_to_mm: f64,
    max_step_mm: f64,
) -> Result<(), TransportError> {
    let dz = z_to_mm - state.z_mm;
    if dz == 0.0 {
        return Ok(());
    }
    if let Field::Uniform {
        b_tesla: [0.0, 0.0, 0.0],
    } = field
    {
        state.x_mm += state.tx * dz;
        state.y_mm += state.ty * dz;
        state.z_mm = z_to_mm;
        return Ok(());
    }
    let n_steps = (dz.abs() / max_step_mm.max(1e-3)).ceil().max(1.0) as u64;
    let h = dz / n_steps as f64;
    let qop = state.qop;
    let mut s = [state.x_mm, state.y_mm, state.tx, state.ty];
    let z0 = state.z_mm;
    for i in 0..n_steps {
        let z = z0 + h * i as f64;
        let k1 = derivatives(field, z, s, qop);
        let s2 = std::array::from_fn(|j| s[j] + 0.5 * h * k1[j]);
        let k2 = derivatives(field, z + 0.5 * h, s2, qop);
        let s3 = std::array::from_fn(|j| s[j] + 0.5 * h * k2[j]);
        let k3 = derivatives(field, z + 0.5 * h, s3, qop);
        let s4 = std::array::from_fn(|j| s[j] + h * k3[j]);
        let k4 = derivatives(field, z + h, s4, qop);
        let next: [f64; 4] =
            std::array::from_fn(|j| s[j] + h / 6.0 * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]));
        let z_next = if i + 1 == n_steps { z_to_mm } else { z + h };
        if next.iter().any(|v| !v.is_finite()) {
            return Err(TransportError::NonFinite { z_mm: z_next });
        }
        if next[2].abs() > MAX_SLOPE || next[3].abs() > MAX_SLOPE {
            return Err(TransportError::Curled { z_mm: z_next });
        }
        s = next;
        state.x_mm = s[0];
        state.y_mm = s[1];
        state.tx = s[2];
        state.ty = s[3];
        state.z_mm = z_next;
    }
    Ok(())
}

/// Highland's width of the projected scattering angle (radians) for a unit-charge particle
/// of momentum `p_gev` and velocity `beta` through `x_over_x0` radiation lengths.
pub fn highland_theta0(p_gev: f64, beta: f64, x_over_x0: f64) -> f64 {
    if x_over_x0 <= 0.0 {
        return 0.0;
    }
    0.0136 / (beta * p_gev) * x_over_x0.sqrt() * (1.0 + 0.038 * (x_over_x0 / (beta * beta)).ln())
}

/// Applies two independent projected scattering angles of width `theta0` (perpendicular to
/// the direction of flight) to the slopes of `state`.
pub fn scatter(state: &mut StateVector, theta0: f64, rng: &mut impl Rng) {
    let Ok(normal) = Normal::new(0.0, theta0) else {
        return;
    };
    if theta0 <= 0.0 {
        return;
    }
    let (a, b) = (normal.sample(rng).tan(), normal.sample(rng).tan());
    let (tx, ty) = (state.tx, state.ty);
    let n = (1.0 + tx * tx + ty * ty).sqrt();
    let d = [tx / n, ty / n, 1.0 / n];
    let nu = (1.0 + tx * tx).sqrt();
    let u = [1.0 / nu, 0.0, -tx / nu];
    // v = d x u
    let v = [
        d[1] * u[2] - d[2] * u[1],
        d[2] * u[0] - d[0] * u[2],
        d[0] * u[1] - d[1] * u[0],
    ];
    let e: [f64; 3] = std::array::from_fn(|k| d[k] + a * u[k] + b * v[k]);
    if e[2] > 0.0 {
        state.tx = e[0] / e[2];
        state.ty = e[1] / e[2];
    }
}

/// Particle species produced at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Species {
    Pion,
    Kaon,
    Proton,
}

impl Species {
    pub fn mass_gev(self) -> f64 {
        match self {
            Species::Pion => PION_MASS_GEV,
            Species::Kaon => KAON_MASS_GEV,
            Species::Proton => PROTON_MASS_GEV,
        }
    }
    /// PDG code of the positive particle.
    pub fn pdg(self) -> i32 {
        match self {
            Species::Pion => 211,
            Species::Kaon => 321,
            Species::Proton => 2212,
        }
    }
}

/// A generated particle.
#[derive(Debug, Clone, PartialEq)]
pub struct Particle {
    /// 1, 2, ... within the event (0 is reserved for noise hits).
    pub id: u64,
    /// PDG code, signed by charge.
    pub pdg: i32,
    /// Charge in units of e.
    pub q: i32,
    pub mass_gev: f64,
    pub vertex_mm: [f64; 3],
    /// Momentum at the vertex, GeV/c.
    pub momentum_gev: [f64; 3],
    /// Number of hits it left (at most one per plane).
    pub n_hits: u32,
}

impl Particle {
    pub fn p_gev(&self) -> f64 {
        let m = self.momentum_gev;
        (m[0] * m[0] + m[1] * m[1] + m[2] * m[2]).sqrt()
    }
}

/// Truth of one hit (same index as the hit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HitTruth {
    /// 0 for noise hits.
    pub particle_id: u64,
    /// True crossing point, mm (for noise: the hit position).
    pub pos_mm: [f64; 3],
    /// Momentum just after the plane, GeV/c (zero for noise).
    pub momentum_gev: [f64; 3],
    /// TrackML scoring weight (see the module documentation).
    pub weight: f64,
}

/// One simulated event: hits ordered by plane, their truth, and all generated particles.
#[derive(Debug, Clone, PartialEq)]
pub struct SimEvent {
    pub event_id: u64,
    pub hits: Vec<HitRecord>,
    pub truth: Vec<HitTruth>,
    pub particles: Vec<Particle>,
}

/// Named event classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// Minimum-bias interactions: about 40 charged particles, 20 of them in the acceptance.
    Minbias,
    /// Central heavy-ion-like events: about 2500 charged particles, well over 1000 in the
    /// acceptance.
    Central,
}

/// The law of the produced particles' momenta and directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spectrum {
    /// Transverse momentum from `pT exp(-pT / T)` and Gaussian rapidity (the module
    /// documentation): a fixed-target hadronic interaction.
    Hadronic,
    /// Momentum `p_min + Exp(p_mean - p_min)` (mean `p_mean_gev`), polar angle
    /// `|N(0, theta_sigma_rad)|`, uniform azimuth: a beam-like forward spectrum that
    /// starts below a finder's minimum momentum.
    Exponential {
        p_min_gev: f64,
        p_mean_gev: f64,
        theta_sigma_rad: f64,
    },
}

impl Spectrum {
    /// The forward spectrum of the `forward` detector's test sample: from 0.6 GeV/c,
    /// mean 4.6 GeV/c, polar angle sigma 0.12 rad.
    pub const FORWARD: Spectrum = Spectrum::Exponential {
        p_min_gev: 0.6,
        p_mean_gev: 4.6,
        theta_sigma_rad: 0.12,
    };
}

/// Simulation parameters. Start from [`SimConfig::preset`].
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Mean number of charged particles per event (Poisson).
    pub multiplicity_mean: f64,
    /// How momenta and directions are drawn.
    pub spectrum: Spectrum,
    /// Mean transverse momentum, GeV/c (`pT exp(-pT/T)` with `T` = half of it), for
    /// [`Spectrum::Hadronic`].
    pub pt_mean_gev: f64,
    pub rapidity_mean: f64,
    pub rapidity_sigma: f64,
    /// Fractions of pions, kaons, protons (normalised when drawn).
    pub species_fractions: [f64; 3],
    pub target_z_mm: f64,
    pub target_thickness_mm: f64,
    /// Beam spot, one standard deviation in x and y.
    pub beam_sigma_xy_mm: f64,
    /// Beam spot's centre in x and y, mm (0: on the geometry's axis).
    pub beam_centre_mm: [f64; 2],
    /// Mean number of noise hits per plane (Poisson), uniform over the plane.
    pub noise_hits_per_plane: f64,
    /// Longest Runge-Kutta step.
    pub max_step_mm: f64,
    /// Switches for tests: turn effects off to check the rest exactly.
    pub multiple_scattering: bool,
    pub smearing: bool,
    pub inefficiency: bool,
}

impl SimConfig {
    pub fn preset(preset: Preset) -> Self {
        let base = SimConfig {
            multiplicity_mean: 40.0,
            spectrum: Spectrum::Hadronic,
            pt_mean_gev: 0.4,
            rapidity_mean: 2.8,
            rapidity_sigma: 1.2,
            species_fractions: [0.8, 0.1, 0.1],
            target_z_mm: 0.0,
            target_thickness_mm: 1.0,
            beam_sigma_xy_mm: 0.3,
            beam_centre_mm: [0.0; 2],
            noise_hits_per_plane: 2.0,
            max_step_mm: 20.0,
            multiple_scattering: true,
            smearing: true,
            inefficiency: true,
        };
        match preset {
            Preset::Minbias => base,
            Preset::Central => SimConfig {
                multiplicity_mean: 2500.0,
                noise_hits_per_plane: 50.0,
                ..base
            },
        }
    }

    /// A beam-like forward sample ([`Spectrum::FORWARD`]: from 0.6 GeV/c, mean 4.6 GeV/c),
    /// a 50 um beam spot and six noise hits per plane; 150 particles (minimum bias) or
    /// 1000 (central).
    pub fn forward(preset: Preset) -> Self {
        SimConfig {
            spectrum: Spectrum::FORWARD,
            beam_sigma_xy_mm: 0.05,
            noise_hits_per_plane: 6.0,
            multiplicity_mean: match preset {
                Preset::Minbias => 150.0,
                Preset::Central => 1000.0,
            },
            ..SimConfig::preset(Preset::Minbias)
        }
    }
}

/// The random stream for `event_id` of a run seeded with `seed`: events are reproducible
/// one by one, whatever else was simulated.
pub fn event_rng(seed: u64, event_id: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(event_id);
    rng
}

/// Simulates `n_events` events numbered from `first_event_id`, each from its own stream.
pub fn simulate_events<'a>(
    det: &'a Detector,
    cfg: &'a SimConfig,
    seed: u64,
    first_event_id: u64,
    n_events: u64,
) -> impl Iterator<Item = SimEvent> + 'a {
    (first_event_id..first_event_id + n_events).map(move |event_id| {
        let mut ev = simulate_event(det, cfg, &mut event_rng(seed, event_id));
        ev.event_id = event_id;
        ev
    })
}

struct PendingHit {
    plane: u16,
    x_mm: f64,
    y_mm: f64,
    truth: HitTruth,
}

fn draw_species(cfg: &SimConfig, rng: &mut impl Rng) -> Species {
    let f = cfg.species_fractions.map(|v| v.max(0.0));
    let total: f64 = f.iter().sum();
    if total <= 0.0 {
        return Species::Pion;
    }
    let u = rng.random::<f64>() * total;
    if u < f[0] {
        Species::Pion
    } else if u < f[0] + f[1] {
        Species::Kaon
    } else {
        Species::Proton
    }
}

/// Simulates one event (its `event_id` is 0: callers number events).
pub fn simulate_event(det: &Detector, cfg: &SimConfig, rng: &mut impl Rng) -> SimEvent {
    let n_particles = if cfg.multiplicity_mean > 0.0 {
        Poisson::new(cfg.multiplicity_mean)
            .map(|d| d.sample(rng) as usize)
            .unwrap_or(0)
    } else {
        0
    };
    let pt_law =
        Gamma::new(2.0, (cfg.pt_mean_gev / 2.0).max(1e-6)).expect("positive Gamma parameters");
    let rapidity =
        Normal::new(cfg.rapidity_mean, cfg.rapidity_sigma.max(0.0)).expect("finite rapidity law");
    let beam = Normal::new(0.0, cfg.beam_sigma_xy_mm.max(0.0)).expect("finite beam spot");

    let mut particles = Vec::with_capacity(n_particles);
    let mut pending: Vec<PendingHit> = Vec::with_capacity(n_particles * det.planes.len() / 2 + 16);
    for i in 0..n_particles {
        let species = draw_species(cfg, rng);
        let q: i32 = if species == Species::Proton || rng.random::<bool>() {
            1
        } else {
            -1
        };
        let mass = species.mass_gev();
        let momentum = match cfg.spectrum {
            Spectrum::Hadronic => {
                let pt = pt_law.sample(rng);
                let y = rapidity.sample(rng);
                let phi = rng.random::<f64>() * std::f64::consts::TAU;
                let mt = (mass * mass + pt * pt).sqrt();
                [pt * phi.cos(), pt * phi.sin(), mt * y.sinh()]
            }
            Spectrum::Exponential {
                p_min_gev,
                p_mean_gev,
                theta_sigma_rad,
            } => {
                let scale = (p_mean_gev - p_min_gev).max(1e-6);
                let p = p_min_gev - scale * (1.0 - rng.random::<f64>()).ln();
                let theta = (theta_sigma_rad * rng.sample::<f64, _>(rand_distr::StandardNormal))
                    .abs()
                    .min(std::f64::consts::FRAC_PI_2);
                let phi = rng.random::<f64>() * std::f64::consts::TAU;
                let pt = p * theta.sin();
                [pt * phi.cos(), pt * phi.sin(), p * theta.cos()]
            }
        };
        let vertex = [
            cfg.beam_centre_mm[0] + beam.sample(rng),
            cfg.beam_centre_mm[1] + beam.sample(rng),
            cfg.target_z_mm + (rng.random::<f64>() - 0.5) * cfg.target_thickness_mm,
        ];
        let mut particle = Particle {
            id: i as u64 + 1,
            pdg: species.pdg() * q,
            q,
            mass_gev: mass,
            vertex_mm: vertex,
            momentum_gev: momentum,
            n_hits: 0,
        };
        if momentum[2] > 0.0 {
            particle.n_hits = transport_particle(det, cfg, &particle, rng, &mut pending);
        }
        particles.push(particle);
    }

    for (index, plane) in det.planes.iter().enumerate() {
        let n_noise = if cfg.noise_hits_per_plane > 0.0 {
            Poisson::new(cfg.noise_hits_per_plane)
                .map(|d| d.sample(rng) as usize)
                .unwrap_or(0)
        } else {
            0
        };
        for _ in 0..n_noise {
            let x = (rng.random::<f64>() * 2.0 - 1.0) * plane.half_x_mm;
            let y = (rng.random::<f64>() * 2.0 - 1.0) * plane.half_y_mm;
            pending.push(PendingHit {
                plane: index as u16,
                x_mm: x,
                y_mm: y,
                truth: HitTruth {
                    particle_id: 0,
                    pos_mm: [x, y, plane.z_mm],
                    momentum_gev: [0.0; 3],
                    weight: 0.0,
                },
            });
        }
    }

    // Readout order: by plane, then by x (as a sensor read column by column would give).
    pending.sort_by(|a, b| a.plane.cmp(&b.plane).then(a.x_mm.total_cmp(&b.x_mm)));
    let n_weighted: usize = particles
        .iter()
        .filter(|p| p.n_hits as usize >= RECONSTRUCTABLE_MIN_PLANES)
        .map(|p| p.n_hits as usize)
        .sum();
    let weight_per_hit = if n_weighted > 0 {
        1.0 / n_weighted as f64
    } else {
        0.0
    };
    let mut hits = Vec::with_capacity(pending.len());
    let mut truth = Vec::with_capacity(pending.len());
    for (i, h) in pending.into_iter().enumerate() {
        let mut t = h.truth;
        if t.particle_id != 0
            && particles[(t.particle_id - 1) as usize].n_hits as usize >= RECONSTRUCTABLE_MIN_PLANES
        {
            t.weight = weight_per_hit;
        }
        hits.push(HitRecord {
            x_mm: h.x_mm as f32,
            y_mm: h.y_mm as f32,
            z_mm: det.planes[h.plane as usize].z_mm as f32,
            plane: h.plane,
            hit_id: i as u32 + 1,
        });
        truth.push(t);
    }
    SimEvent {
        event_id: 0,
        hits,
        truth,
        particles,
    }
}

/// Transports one particle plane by plane, appending its hits; returns how many it left.
fn transport_particle(
    det: &Detector,
    cfg: &SimConfig,
    particle: &Particle,
    rng: &mut impl Rng,
    out: &mut Vec<PendingHit>,
) -> u32 {
    let mut state =
        StateVector::from_momentum(particle.vertex_mm, particle.momentum_gev, particle.q as f64);
    let p = particle.p_gev();
    let beta = p / (p * p + particle.mass_gev * particle.mass_gev).sqrt();
    let mut n_hits = 0;
    for (index, plane) in det.planes.iter().enumerate() {
        if plane.z_mm <= state.z_mm {
            continue;
        }
        if propagate(&det.field, &mut state, plane.z_mm, cfg.max_step_mm).is_err() {
            break;
        }
        if !plane.contains(state.x_mm, state.y_mm) {
            continue;
        }
        if cfg.multiple_scattering {
            scatter_in_plane(plane, &mut state, p, beta, rng);
        }
        if cfg.inefficiency && rng.random::<f64>() >= plane.efficiency {
            continue;
        }
        let (mut x, mut y) = (state.x_mm, state.y_mm);
        if cfg.smearing {
            x += plane.sigma_x_mm * rng.sample::<f64, _>(rand_distr::StandardNormal);
            y += plane.sigma_y_mm * rng.sample::<f64, _>(rand_distr::StandardNormal);
        }
        out.push(PendingHit {
            plane: index as u16,
            x_mm: x,
            y_mm: y,
            truth: HitTruth {
                particle_id: particle.id,
                pos_mm: [state.x_mm, state.y_mm, state.z_mm],
                momentum_gev: state.momentum_gev(),
                weight: 0.0,
            },
        });
        n_hits += 1;
    }
    n_hits
}

fn scatter_in_plane(
    plane: &Plane,
    state: &mut StateVector,
    p_gev: f64,
    beta: f64,
    rng: &mut impl Rng,
) {
    let path = plane.x0_fraction * (1.0 + state.tx * state.tx + state.ty * state.ty).sqrt();
    scatter(state, highland_theta0(p_gev, beta, path), rng);
}

/// Encodes one event as a native hit-event frame (see [`crate::frame`]).
pub fn encode_event_frame(event: &SimEvent, stamp: Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame::HEADER_LEN + 8 + event.hits.len() * frame::HIT_LEN);
    frame::encode_hit_event(&mut out, stamp, &event.hits);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(b: [f64; 3]) -> Field {
        Field::Uniform { b_tesla: b }
    }

    /// Closed-form helix in a uniform field along y: the track is a circle of radius
    /// R = p_perp / (kappa B) in x-z and advances linearly in y.
    fn analytic_helix(start: StateVector, b_y: f64, z_to: f64) -> StateVector {
        let p = start.momentum_gev();
        let q = start.qop.signum();
        let p_perp = (p[0] * p[0] + p[2] * p[2]).sqrt();
        let omega = q * KAPPA_GEV_PER_T_MM * b_y / p_perp; // dphi/ds = -omega
        let phi0 = p[0].atan2(p[2]);
        let sin_phi = phi0.sin() - omega * (z_to - start.z_mm);
        let phi = sin_phi.asin();
        let s = (phi0 - phi) / omega;
        StateVector {
            z_mm: z_to,
            x_mm: start.x_mm + (phi.cos() - phi0.cos()) / omega,
            y_mm: start.y_mm + p[1] / p_perp * s,
            tx: phi.tan(),
            ty: p[1] / p_perp / phi.cos(),
            qop: start.qop,
        }
    }

    #[test]
    fn runge_kutta_matches_the_analytic_helix() {
        for (p, q, b_y) in [
            ([0.3, 0.1, 2.0], 1.0, 1.0),
            ([-0.2, -0.15, 0.8], -1.0, 0.8),
            ([0.05, 0.02, 20.0], 1.0, 1.5),
        ] {
            let start = StateVector::from_momentum([1.0, -2.0, 0.0], p, q);
            let mut s = start;
            propagate(&uniform([0.0, b_y, 0.0]), &mut s, 1000.0, 10.0).unwrap();
            let want = analytic_helix(start, b_y, 1000.0);
            let rel = |a: f64, b: f64, scale: f64| (a - b).abs() / scale;
            // Relative to the quantity's scale (x, y: distance travelled; slopes: 1).
            assert!(
                rel(s.x_mm, want.x_mm, 1000.0) < 1e-6,
                "x {} vs {}",
                s.x_mm,
                want.x_mm
            );
            assert!(
                rel(s.y_mm, want.y_mm, 1000.0) < 1e-6,
                "y {} vs {}",
                s.y_mm,
                want.y_mm
            );
            assert!(rel(s.tx, want.tx, 1.0) < 1e-6, "tx {} vs {}", s.tx, want.tx);
            assert!(rel(s.ty, want.ty, 1.0) < 1e-6, "ty {} vs {}", s.ty, want.ty);
            assert_eq!(s.z_mm, 1000.0);
            // The bend is real (not a straight line that trivially matches).
            assert!((s.tx - start.tx).abs() > 1e-3);
        }
    }

    #[test]
    fn bending_direction_follows_the_lorentz_force() {
        // q > 0 moving along +z in By > 0: F = q v x B points to -x.
        let mut s = StateVector::from_momentum([0.0; 3], [0.0, 0.0, 1.0], 1.0);
        propagate(&uniform([0.0, 1.0, 0.0]), &mut s, 500.0, 10.0).unwrap();
        assert!(s.tx < 0.0 && s.x_mm < 0.0);
        // Radius check: sagitta-free slope after dz: sin(phi) = dz / R.
        let r = 1.0 / (KAPPA_GEV_PER_T_MM * 1.0);
        assert!(((-s.tx).atan().sin() - 500.0 / r).abs() < 1e-9);
    }

    #[test]
    fn transport_backwards_returns_to_the_start() {
        let field = uniform([0.1, 0.9, -0.2]);
        let start = StateVector::from_momentum([3.0, 4.0, 100.0], [0.2, -0.1, 1.5], -1.0);
        let mut s = start;
        propagate(&field, &mut s, 900.0, 5.0).unwrap();
        propagate(&field, &mut s, 100.0, 5.0).unwrap();
        assert!((s.x_mm - start.x_mm).abs() < 1e-7 && (s.ty - start.ty).abs() < 1e-10);
    }

    #[test]
    fn curling_particle_is_stopped() {
        let mut s = StateVector::from_momentum([0.0; 3], [0.0, 0.0, 0.05], 1.0);
        let err = propagate(&uniform([0.0, 1.0, 0.0]), &mut s, 1000.0, 10.0).unwrap_err();
        assert!(matches!(err, TransportError::Curled { .. }));
    }

    #[test]
    fn highland_width_of_the_scattering_kicks() {
        let (p, beta, x) = (2.0, 0.9976, 0.004);
        let theta0 = highland_theta0(p, beta, x);
        // PDG: 13.6 MeV / (beta c p) sqrt(x/X0) (1 + 0.038 ln(x/X0/beta^2)).
        let want = 0.0136 / (beta * p) * x.sqrt() * (1.0 + 0.038 * (x / beta / beta).ln());
        assert!((theta0 - want).abs() < 1e-15 && theta0 > 1e-4);
        let mut rng = event_rng(7, 0);
        let n = 20_000;
        let (mut sum_x, mut sum_y, mut sum_xx, mut sum_yy) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..n {
            let mut s = StateVector {
                z_mm: 0.0,
                x_mm: 0.0,
                y_mm: 0.0,
                tx: 0.0,
                ty: 0.0,
                qop: 0.5,
            };
            scatter(&mut s, theta0, &mut rng);
            sum_x += s.tx;
            sum_y += s.ty;
            sum_xx += s.tx * s.tx;
            sum_yy += s.ty * s.ty;
        }
        let n = n as f64;
        for (sum, sum_sq) in [(sum_x, sum_xx), (sum_y, sum_yy)] {
            let mean = sum / n;
            let width = (sum_sq / n - mean * mean).sqrt();
            // Standard error of a width from 20000 samples is 0.5 %: allow 3 %.
            assert!(
                (width / theta0 - 1.0).abs() < 0.03,
                "width {width} vs theta0 {theta0}"
            );
            assert!(mean.abs() < 4.0 * theta0 / n.sqrt());
        }
    }

    fn detector() -> Detector {
        Detector::from_toml_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/detector.toml"
        ))
        .unwrap()
    }

    #[test]
    fn a_seed_reproduces_its_events() {
        let det = detector();
        let cfg = SimConfig::preset(Preset::Minbias);
        let a: Vec<SimEvent> = simulate_events(&det, &cfg, 42, 0, 3).collect();
        let b: Vec<SimEvent> = simulate_events(&det, &cfg, 42, 0, 3).collect();
        assert_eq!(a, b);
        // Event 2 alone is the same as event 2 of the run.
        let c: Vec<SimEvent> = simulate_events(&det, &cfg, 42, 2, 1).collect();
        assert_eq!(c[0], a[2]);
        let d: Vec<SimEvent> = simulate_events(&det, &cfg, 43, 0, 1).collect();
        assert_ne!(d[0].hits, a[0].hits);
    }

    #[test]
    fn events_are_consistent_with_the_detector() {
        let det = detector();
        let cfg = SimConfig::preset(Preset::Minbias);
        let mut below_1gev = 0;
        let mut above_1gev = 0;
        for ev in simulate_events(&det, &cfg, 1, 0, 20) {
            assert_eq!(ev.hits.len(), ev.truth.len());
            let mut per_particle = vec![0u32; ev.particles.len() + 1];
            for (i, (h, t)) in ev.hits.iter().zip(&ev.truth).enumerate() {
                assert_eq!(h.hit_id as usize, i + 1);
                let plane = &det.planes[h.plane as usize];
                assert_eq!(h.z_mm, plane.z_mm as f32);
                assert!(plane.contains(t.pos_mm[0], t.pos_mm[1]));
                if t.particle_id != 0 {
                    per_particle[t.particle_id as usize] += 1;
                    // Smearing stays within 6 sigma.
                    assert!(((h.x_mm as f64) - t.pos_mm[0]).abs() < 6.0 * plane.sigma_x_mm);
                    assert!(t.momentum_gev[2] > 0.0);
                }
                if i > 0 {
                    assert!(ev.hits[i - 1].plane <= h.plane);
                }
            }
            let total_weight: f64 = ev.truth.iter().map(|t| t.weight).sum();
            assert!(total_weight == 0.0 || (total_weight - 1.0).abs() < 1e-9);
            for p in &ev.particles {
                assert_eq!(p.n_hits, per_particle[p.id as usize]);
                if p.n_hits >= 4 {
                    if p.p_gev() < 1.0 {
                        below_1gev += 1;
                    } else {
                        above_1gev += 1;
                    }
                }
            }
        }
        assert!(
            below_1gev > 0 && above_1gev > 0,
            "{below_1gev} below and {above_1gev} above 1 GeV/c"
        );
    }

    #[test]
    fn without_effects_hits_lie_on_the_transported_trajectory() {
        let det = detector();
        let cfg = SimConfig {
            multiple_scattering: false,
            smearing: false,
            inefficiency: false,
            noise_hits_per_plane: 0.0,
            ..SimConfig::preset(Preset::Minbias)
        };
        let ev = simulate_event(&det, &cfg, &mut event_rng(3, 0));
        let p = ev
            .particles
            .iter()
            .find(|p| p.n_hits as usize == det.planes.len())
            .expect("a particle through all planes");
        let mut s = StateVector::from_momentum(p.vertex_mm, p.momentum_gev, p.q as f64);
        for (h, t) in ev
            .hits
            .iter()
            .zip(&ev.truth)
            .filter(|(_, t)| t.particle_id == p.id)
        {
            propagate(&det.field, &mut s, h.z_mm as f64, 1.0).unwrap();
            assert!((s.x_mm - t.pos_mm[0]).abs() < 1e-6 && (s.y_mm - t.pos_mm[1]).abs() < 1e-6);
            assert!((h.x_mm as f64 - t.pos_mm[0]).abs() < 1e-4);
        }
    }

    #[test]
    fn frames_decode_to_the_same_hits() {
        let det = detector();
        let ev = simulate_event(
            &det,
            &SimConfig::preset(Preset::Minbias),
            &mut event_rng(5, 0),
        );
        let bytes = encode_event_frame(
            &ev,
            Stamp {
                source_id: 1,
                sequence: 9,
                timestamp_ns: 0,
            },
        );
        let view = frame::parse(&bytes).unwrap();
        let frame::Payload::Hits(hits) = view.payload else {
            panic!("not a hit event")
        };
        assert_eq!(hits.len(), ev.hits.len());
        for (a, b) in hits.iter().zip(&ev.hits) {
            assert_eq!(
                (a.x_mm.get(), a.plane.get(), a.hit_id.get()),
                (b.x_mm, b.plane, b.hit_id)
            );
        }
    }
}
