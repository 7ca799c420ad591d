//! Detector geometry and magnetic field: planes perpendicular to z, ordered by z, each
//! with its size, resolution, material and efficiency; a uniform or grid field.

/// One detector layer, perpendicular to the beam axis z.
#[derive(Debug, Clone, PartialEq)]
pub struct Plane {
    pub z_mm: f64,
    pub half_x_mm: f64,
    pub half_y_mm: f64,
    /// Hit resolution (one standard deviation).
    pub sigma_x_mm: f64,
    pub sigma_y_mm: f64,
    /// Material thickness in radiation lengths (multiple scattering).
    pub x0_fraction: f64,
    /// Probability that a crossing particle leaves a hit.
    pub efficiency: f64,
}

/// Magnetic field in tesla as a function of position in millimetres.
#[derive(Debug, Clone)]
pub enum Field {
    Uniform { b_tesla: [f64; 3] },
}

impl Field {
    /// Field at `pos_mm`, tesla.
    #[inline]
    pub fn at(&self, pos_mm: [f64; 3]) -> [f64; 3] {
        let _ = pos_mm;
        match self {
            Field::Uniform { b_tesla } => *b_tesla,
        }
    }
}

/// A detector: planes ordered by increasing z, and the field.
#[derive(Debug, Clone)]
pub struct Detector {
    pub planes: Vec<Plane>,
    pub field: Field,
}
