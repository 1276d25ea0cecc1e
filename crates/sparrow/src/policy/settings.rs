//! Each policy's settings, held by type so that [`super::AttentionChoice`] needs no field
//! per policy: a policy declares its settings struct in its own file, the registry entry
//! names the type, and every command that takes attention flags gets that struct's flags
//! (with feature `cli`, the [`SettingsMap`] is a clap argument group built from the
//! registry).

#[cfg(feature = "cli")]
use super::REGISTRY;
use std::any::Any;
use std::fmt::Debug;

/// What a policy's settings struct must be: defaults, cloneable, printable, and (with
/// feature `cli`) a clap argument group whose flags the commands accept.
#[cfg(feature = "cli")]
pub trait PolicySettings:
    Default + Clone + Debug + Send + Sync + 'static + clap::Args + clap::FromArgMatches
{
}
#[cfg(feature = "cli")]
impl<T> PolicySettings for T where
    T: Default + Clone + Debug + Send + Sync + 'static + clap::Args + clap::FromArgMatches
{
}

/// What a policy's settings struct must be: defaults, cloneable, printable, and (with
/// feature `cli`) a clap argument group whose flags the commands accept.
#[cfg(not(feature = "cli"))]
pub trait PolicySettings: Default + Clone + Debug + Send + Sync + 'static {}
#[cfg(not(feature = "cli"))]
impl<T> PolicySettings for T where T: Default + Clone + Debug + Send + Sync + 'static {}

/// The settings of a policy that has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct NoSettings {}

/// A settings value with its type erased.
trait AnySettings: Any + Debug + Send + Sync {
    fn clone_box(&self) -> Box<dyn AnySettings>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: PolicySettings> AnySettings for T {
    fn clone_box(&self) -> Box<dyn AnySettings> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A settings type as the registry holds it: with feature `cli`, its flags and how to read
/// them back. Each policy has its own type (two entries sharing one would declare its flags
/// twice, which clap refuses).
pub struct SettingsType {
    #[cfg(feature = "cli")]
    augment: fn(clap::Command) -> clap::Command,
    #[cfg(feature = "cli")]
    from_matches: fn(&clap::ArgMatches) -> Result<Box<dyn AnySettings>, clap::Error>,
}

impl SettingsType {
    /// The erased form of `S`.
    pub const fn of<S: PolicySettings>() -> SettingsType {
        SettingsType {
            #[cfg(feature = "cli")]
            augment: <S as clap::Args>::augment_args,
            #[cfg(feature = "cli")]
            from_matches: from_matches::<S>,
        }
    }
}

#[cfg(feature = "cli")]
fn from_matches<S: PolicySettings>(
    m: &clap::ArgMatches,
) -> Result<Box<dyn AnySettings>, clap::Error> {
    Ok(Box::new(S::from_arg_matches(m)?))
}

/// The settings of every policy, one value per settings type; a type not set reads as its
/// default.
#[derive(Debug, Default)]
pub struct SettingsMap(Vec<Box<dyn AnySettings>>);

impl Clone for SettingsMap {
    fn clone(&self) -> Self {
        SettingsMap(self.0.iter().map(|s| s.clone_box()).collect())
    }
}

impl SettingsMap {
    /// The settings of type `S` (its default when not set).
    pub fn get<S: PolicySettings>(&self) -> S {
        self.0
            .iter()
            .find_map(|s| s.as_any().downcast_ref::<S>())
            .cloned()
            .unwrap_or_default()
    }

    /// The settings of type `S` to change in place (set to the default first if absent).
    pub fn get_mut<S: PolicySettings>(&mut self) -> &mut S {
        let at = match self.0.iter().position(|s| s.as_any().is::<S>()) {
            Some(i) => i,
            None => {
                self.0.push(Box::new(S::default()));
                self.0.len() - 1
            }
        };
        self.0[at]
            .as_any_mut()
            .downcast_mut::<S>()
            .expect("the slot holds an S: it was found or pushed as one")
    }
}

/// With feature `cli` the map is a clap argument group: the flags of every registered
/// policy's settings.
#[cfg(feature = "cli")]
impl clap::FromArgMatches for SettingsMap {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        REGISTRY
            .iter()
            .map(|entry| (entry.settings.from_matches)(m))
            .collect::<Result<_, _>>()
            .map(SettingsMap)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

#[cfg(feature = "cli")]
impl clap::Args for SettingsMap {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        REGISTRY
            .iter()
            .fold(cmd, |cmd, entry| (entry.settings.augment)(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{QuestSettings, StreamingAttention};
    use super::*;

    #[test]
    fn unset_types_read_as_defaults_and_changes_stick() {
        let mut map = SettingsMap::default();
        assert_eq!(map.get::<QuestSettings>(), QuestSettings::default());
        map.get_mut::<QuestSettings>().budget = 77;
        assert_eq!(map.get::<QuestSettings>().budget, 77);
        let copy = map.clone();
        map.get_mut::<QuestSettings>().budget = 5;
        assert_eq!(copy.get::<QuestSettings>().budget, 77);
        assert_eq!(
            map.get::<StreamingAttention>(),
            StreamingAttention::default()
        );
    }
}
