# provisioner: the Ray virtualenv on the PATH of login shells (`ray up` runs commands
# through `bash --login -c -i`, which rebuilds PATH from /etc/profile).
case ":${PATH}:" in
  *:/opt/ray/bin:*) ;;
  *) export PATH="/opt/ray/bin:${PATH}" ;;
esac
export VIRTUAL_ENV=/opt/ray
export RAY_USAGE_STATS_ENABLED=0
