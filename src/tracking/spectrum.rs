//! What momenta the tracks have where no field measures them: the spectrum the fit's
//! scattering estimate assumes ([`KalmanFitter::scattering_qop`]), learned from the
//! tracks of the first events.
//!
//! Without a field, each track's momentum for its scattering comes from the kinks its
//! hits show. With five to eight planes and a resolution as large as the scattering they
//! hardly tell one track's momentum, and the estimate leans on its prior: a prior that
//! does not know the spectrum makes the pulls as wide as the spectrum is far from it
//! (0.87 for a hard one, 1.1 for a soft one on drawn telescopes). The kinks of hundreds
//! of tracks together tell the spectrum well ([`learn_scatter_prior`]): it is measured
//! here, as the beam spot is ([`super::beam_spot`]), and given to the fit as
//! `[tracking.finder.fit] scatter_prior`.

use super::geometry::Detector;
use super::kalman::{learn_scatter_prior, FitHit, KalmanFitter, SCATTER_GRID};
use super::reco::{FinderConfig, Reconstructor};
use crate::frame::HitRecord;

/// Fewest hits of a track the spectrum is learned from (two kinks and more).
pub const MIN_HITS: usize = 4;
/// Most tracks it is learned from.
pub const MAX_TRACKS: usize = 5_000;
/// Most events read for them.
pub const MAX_EVENTS: usize = 50;

/// The spectrum of the tracks the finder `cfg` finds in the first events of `events` (up
/// to [`MAX_EVENTS`], or fewer once [`MAX_TRACKS`] tracks of at least [`MIN_HITS`] hits
/// within the finder's chi-square cut are read), as the weights of the scattering
/// estimate's points of q/p, and the number of tracks it was learned from. `None` where
/// the fit does not estimate the scattering (a field measures the momentum, or the
/// configuration gives one), where the configuration gives a spectrum already, or with too
/// few tracks ([`super::kalman::SCATTER_PRIOR_MIN_TRACKS`]).
pub fn measure_scatter_prior<E: AsRef<[HitRecord]>>(
    det: &Detector,
    cfg: &FinderConfig,
    events: impl IntoIterator<Item = E>,
) -> Option<([f64; SCATTER_GRID], usize)> {
    if !cfg.fit.estimates_scattering() || cfg.fit.scatter_prior.is_some() {
        return None;
    }
    let fitter = KalmanFitter::new(det, cfg.fit.clone());
    let mut reco = Reconstructor::new(det, cfg.clone());
    let (mut tracks, mut likelihoods, mut fit_hits) = (Vec::new(), Vec::new(), Vec::new());
    for hits in events.into_iter().take(MAX_EVENTS) {
        let hits = hits.as_ref();
        reco.reconstruct(hits, &mut tracks);
        for t in &tracks {
            let within = (t.chi2_ndf() as f64) <= cfg.max_chi2_ndf;
            if t.hits.len() < MIN_HITS || !within {
                continue;
            }
            fit_hits.clear();
            fit_hits.extend(t.hits.iter().map(|&i| FitHit::from(&hits[i as usize])));
            if let Some(l) = fitter.scatter_likelihood(&fit_hits) {
                likelihoods.push(l);
            }
        }
        if likelihoods.len() >= MAX_TRACKS {
            break;
        }
    }
    likelihoods.truncate(MAX_TRACKS);
    learn_scatter_prior(&likelihoods).map(|w| (w, likelihoods.len()))
}

/// The mean momentum of a spectrum on the scattering estimate's points of q/p from
/// `1 / scatter_p_min_gev` down, GeV/c (the mean of 1 / q): what a log line says of it.
pub fn mean_p_gev(weights: &[f64], scatter_p_min_gev: f64) -> f64 {
    let q_max = 1.0 / scatter_p_min_gev;
    weights
        .iter()
        .enumerate()
        .map(|(g, w)| w / (q_max * (g as f64 + 0.5) / SCATTER_GRID as f64))
        .sum::<f64>()
        / weights.iter().sum::<f64>()
}
