/// The card charge.
pub const CHARGE_CARD: ::idem::Step = ::idem::Step::new("charge-card.v1");
::idem::__private::inventory::submit! {
    ::idem::__private::StepDeclaration::new("charge-card.v1", false,
    ::idem::__private::Location { item :
    ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::",
    "CHARGE_CARD"), file : ::idem::__private::core::file!(), line :
    ::idem::__private::core::line!(), },)
}
pub const CHARGE: ::idem::Step = ::idem::Step::new("charge.v1");
::idem::__private::inventory::submit! {
    ::idem::__private::StepDeclaration::new("charge.v1", true,
    ::idem::__private::Location { item :
    ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::",
    "CHARGE"), file : ::idem::__private::core::file!(), line :
    ::idem::__private::core::line!(), },)
}
