package ipvs

// Section headers of Render's text.
const (
	SectionIPVS      = "# ipvsadm -Sn"
	SectionAddresses = "# addresses of the dummy link"
	SectionSets      = "# ipset save"
	SectionRules4    = "# iptables-save"
	SectionRules6    = "# ip6tables-save"
)
