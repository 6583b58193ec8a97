//! idem
